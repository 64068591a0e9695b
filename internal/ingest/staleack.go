package ingest

import (
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A server that restarts after losing its unsynced tail gives the lost
// sequences of LEDGER_IN to new messages. A work queue removes the message
// of any sequence acked, delivered or not (nats-server 2.15, ackMsg). So an
// ack of a message taken before the loss could remove a new message that no
// one has judged, and its publisher would wait for a receipt that never
// comes.
//
// A message taken before a reconnect of either of the ingest's connections
// is therefore settled by nothing: no ack, nak or progress ack. JetStream
// delivers it again after AckWait, and the ledger answers it again with the
// verdict it has (or duplicate). A plain reconnect costs only that second
// answer. Acks go on the copies' connection, which drops what it has not
// sent when its server goes away: an ack buffered across the reconnect
// would reach the new server as a stale one.

// errTakenBeforeReconnect is what settling a message taken before a
// reconnect returns; nothing was sent.
var errTakenBeforeReconnect = errors.New("ingest: the message was taken before a reconnect to NATS; left for redelivery")

// takenMsg is a LEDGER_IN message with the connection epoch it came in.
type takenMsg struct {
	jetstream.Msg
	s     *Service
	epoch uint64
}

// taken wraps m, delivered now, so that it is settled only in its epoch.
func (s *Service) taken(m jetstream.Msg) jetstream.Msg {
	if h := s.cfg.hooks; h != nil && h.staleAcks {
		return m
	}
	return &takenMsg{Msg: m, s: s, epoch: s.epoch()}
}

func (m *takenMsg) current() bool { return m.s.epoch() == m.epoch }

// Ack acks the message on the copies' connection, unless it was taken
// before a reconnect.
func (m *takenMsg) Ack() error {
	if !m.current() {
		return errTakenBeforeReconnect
	}
	return m.s.copies.nc.Publish(m.Reply(), []byte("+ACK"))
}

func (m *takenMsg) Nak() error {
	if !m.current() {
		return errTakenBeforeReconnect
	}
	return m.Msg.Nak()
}

func (m *takenMsg) NakWithDelay(d time.Duration) error {
	if !m.current() {
		return errTakenBeforeReconnect
	}
	return m.Msg.NakWithDelay(d)
}

func (m *takenMsg) InProgress() error {
	if !m.current() {
		return errTakenBeforeReconnect
	}
	return m.Msg.InProgress()
}

// ack acks in's message; a message that cannot be acked is delivered again
// and gets the same verdict.
func (s *Service) ack(in *inbound) {
	err := in.msg.Ack()
	switch {
	case err == nil:
	case errors.Is(err, errTakenBeforeReconnect):
		s.log.Debug("not acked: taken before a reconnect; it will be redelivered and get the same verdict",
			slog.Uint64("source_seq", in.sourceSeq))
	default:
		s.log.Warn("ack failed; the message will be redelivered and get the same verdict",
			slog.Uint64("source_seq", in.sourceSeq), slog.String("error", err.Error()))
	}
}
