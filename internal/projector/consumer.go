package projector

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// prepare applies the streams and both buckets, the deployment's sizes
// over the definitions' ones, and learns the largest value a write carries.
func (s *Service) prepare(ctx context.Context) error {
	opts := streams.Options{Prefix: s.cfg.Prefix, Replicas: s.cfg.Replicas}
	if err := streams.Apply(ctx, s.js, opts); err != nil {
		return err
	}
	kv, cfg, err := s.applyBucket(ctx, wire.BucketTasks, s.cfg.TasksMaxBytes, opts)
	if err != nil {
		return err
	}
	marks, _, err := s.applyBucket(ctx, wire.BucketProjector, s.cfg.MarksMaxBytes, opts)
	if err != nil {
		return err
	}
	s.kv, s.tasks, s.marks = kv, wire.BucketTasks, marks
	s.valueLimit = valueLimit(cfg.MaxValueSize, s.nc.MaxPayload())
	return nil
}

// applyBucket creates or updates a bucket of streams/ with max_bytes set to
// maxBytes unless it is 0.
func (s *Service) applyBucket(ctx context.Context, name string, maxBytes int64, opts streams.Options) (jetstream.KeyValue, jetstream.KeyValueConfig, error) {
	cfg, err := streams.Bucket(name, opts)
	if err != nil {
		return nil, cfg, err
	}
	if maxBytes != 0 {
		cfg.MaxBytes = maxBytes
	}
	kv, err := streams.CreateOrUpdateKeyValue(ctx, s.js, cfg)
	if err != nil {
		return nil, cfg, fmt.Errorf("projector: apply bucket %s: %w", name, err)
	}
	return kv, cfg, nil
}

// kvHeaderRoom is what a value leaves of the bucket's message size for the
// headers of its write (the expected revision).
const kvHeaderRoom = 256

// valueLimit is the largest value a write can carry.
func valueLimit(maxValueSize int32, maxPayload int64) int {
	limit := maxPayload
	if maxValueSize > 0 && (limit <= 0 || int64(maxValueSize) < limit) {
		limit = int64(maxValueSize)
	}
	if limit <= 0 {
		limit = 1 << 20 // the NATS default
	}
	return int(max(limit-kvHeaderRoom, 0))
}

// consumer binds the durable consumer of the partition set, creating it
// with the given deliver policy if it does not exist (from seq startSeq
// of the log when it is not 0). An existing consumer keeps its position
// (a deliver policy cannot be changed).
func (s *Service) consumer(ctx context.Context, policy jetstream.DeliverPolicy, startSeq uint64) (jetstream.Consumer, error) {
	durable := s.cfg.durable()
	if c, err := s.js.Consumer(ctx, wire.StreamLog, durable); err == nil {
		return c, nil
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("projector: consumer %s: %w", durable, err)
	}
	cfg, err := streams.Consumer("projector", streams.Options{Prefix: s.cfg.Prefix})
	if err != nil {
		return nil, err
	}
	cfg.Durable, cfg.Name = durable, durable
	cfg.FilterSubjects, cfg.FilterSubject = s.cfg.filters(), ""
	cfg.DeliverPolicy = policy
	if startSeq > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, startSeq
	}
	cfg.AckWait = s.cfg.AckWait
	c, err := s.js.CreateConsumer(ctx, wire.StreamLog, cfg)
	if errors.Is(err, jetstream.ErrConsumerExists) {
		// Another projector of the same set created it meanwhile.
		if c, err = s.js.Consumer(ctx, wire.StreamLog, durable); err != nil {
			return nil, fmt.Errorf("projector: consumer %s: %w", durable, err)
		}
		return c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("projector: create consumer %s: %w", durable, err)
	}
	return c, nil
}
