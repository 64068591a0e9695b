package ingest

import (
	"context"

	dto "github.com/prometheus/client_model/go"
)

// WouldRejectCount is the service's ledger_ingest_would_reject_total of
// would (stale/<reason>).
func WouldRejectCount(s *Service, would string) float64 {
	var m dto.Metric
	if err := s.metrics.wouldReject.WithLabelValues(would).Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// LogCopiesRestored is the service's ledger_ingest_log_copies_restored_total.
func LogCopiesRestored(s *Service) float64 {
	var m dto.Metric
	if err := s.metrics.tailRestored.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// CheckLogTail runs the tail check once (logtail.go) and returns how many
// copies it published again.
func CheckLogTail(ctx context.Context, s *Service) (int, error) { return s.checkLogTail(ctx) }
