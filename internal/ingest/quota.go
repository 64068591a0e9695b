package ingest

import (
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/pkg/wire"
)

// principalOfSubject is the principal a LEDGER_IN subject names (its third
// token: <prefix>.in.<principal>.…), or "-".
func principalOfSubject(subject string) string {
	parts := strings.SplitN(subject, ".", 4)
	if len(parts) < 4 || !wire.ValidID(parts[2]) {
		return "-"
	}
	return parts[2]
}

// overQuotaLetter is letter m without the original message's body and
// headers: the ledger's headers (the verdict, where it came from) and the
// event id stay, and Ledger-Truncated and Ledger-Headers-Dropped tell what
// was left out.
func overQuotaLetter(m *nats.Msg) *nats.Msg {
	out := nats.NewMsg(m.Subject)
	dropped := nats.Header{}
	for k, vs := range m.Header {
		if k == nats.MsgIdHdr || slices.Contains(wire.DeadLetterHeaders, k) {
			out.Header[k] = vs
		} else {
			dropped[k] = vs
		}
	}
	if out.Header.Get(wire.HeaderTruncated) == "" {
		out.Header.Set(wire.HeaderTruncated, strconv.Itoa(len(m.Data)))
	}
	if out.Header.Get(wire.HeaderHeadersDropped) == "" {
		hb, _ := wire.HeaderSize(dropped)
		out.Header.Set(wire.HeaderHeadersDropped, strconv.Itoa(hb))
	}
	return out
}
