package ingest

// WithCrashAfterPublish returns cfg with a test hook that runs after a
// batch's log and dead-letter copies are stored and before any ack. When the
// hook returns false the batch is abandoned there, as if the process died.
func WithCrashAfterPublish(cfg Config, hook func() bool) Config {
	cfg.hooks = &hooks{afterPublish: hook}
	return cfg
}
