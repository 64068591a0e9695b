package ingest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/natstest"
)

func copyMsg(subject, id string, hdr ...string) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set(nats.MsgIdHdr, id)
	for i := 0; i+1 < len(hdr); i += 2 {
		m.Header.Set(hdr[i], hdr[i+1])
	}
	m.Data = []byte(`{"v":1}`)
	return m
}

func msgsOf(failed []failedCopy) []*nats.Msg {
	out := make([]*nats.Msg, len(failed))
	for i, f := range failed {
		out[i] = f.msg
	}
	return out
}

func newTestCopier(t *testing.T) (*natstest.Server, *nats.Conn, *copier, jetstream.Stream) {
	t.Helper()
	ns := natstest.Start(t)
	nc := ns.Conn(t, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	js := ns.JetStream(t)
	st, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "COPIES", Subjects: []string{"copies.>"}, MaxMsgSize: 4096})
	require.NoError(t, err)
	c, err := newCopier(nc, false)
	require.NoError(t, err)
	t.Cleanup(c.close)
	return ns, nc, c, st
}

// Every kind of publish ack the server sends is read right: stored,
// duplicate, a JetStream error, no stream (503), and none at all.
func TestCopierReadsEveryKindOfPublishAck(t *testing.T) {
	t.Parallel()
	_, nc, c, st := newTestCopier(t)
	ctx := context.Background()

	set := c.publish([]*nats.Msg{copyMsg("copies.a", "id-1"), copyMsg("copies.b", "id-2"), copyMsg("copies.a", "id-1")})
	failed, err, ok := c.wait(ctx, set, 5*time.Second)
	require.True(t, ok)
	require.Empty(t, failed, "%v", err)
	info, infoErr := st.Info(ctx)
	require.NoError(t, infoErr)
	require.EqualValues(t, 2, info.State.Msgs, "the duplicate is acked, not stored")
	for i, want := range []uint64{1, 2, 1} {
		stored, seq := set.outcome(i)
		require.True(t, stored)
		require.Equal(t, want, seq, "copy %d's sequence (a duplicate's: the first copy's)", i)
	}

	refused := copyMsg("copies.c", "id-3", jetstream.ExpectedLastSeqHeader, "999")
	failed, err, ok = c.wait(ctx, c.publish([]*nats.Msg{refused}), 5*time.Second)
	require.True(t, ok)
	require.Equal(t, []*nats.Msg{refused}, msgsOf(failed))
	require.ErrorContains(t, err, "wrong last sequence")
	require.ErrorIs(t, failed[0].err, errWrongLastSeq)
	require.False(t, isTooLarge(failed[0].err), "a refused expectation is not a size error")

	big := copyMsg("copies.e", "id-8")
	big.Data = make([]byte, 8192)
	failed, _, ok = c.wait(ctx, c.publish([]*nats.Msg{big}), 5*time.Second)
	require.True(t, ok)
	require.Len(t, failed, 1)
	require.True(t, isTooLarge(failed[0].err), "the stream's size limit is a permanent error: %v", failed[0].err)

	nowhere := copyMsg("nostream.x", "id-4")
	failed, err, ok = c.wait(ctx, c.publish([]*nats.Msg{nowhere}), 5*time.Second)
	require.True(t, ok)
	require.Equal(t, []*nats.Msg{nowhere}, msgsOf(failed))
	require.ErrorContains(t, err, "503")

	// A subscriber that never answers: no ack within the timeout.
	sub, subErr := nc.SubscribeSync("silent.x")
	require.NoError(t, subErr)
	defer sub.Unsubscribe()
	require.NoError(t, nc.Flush())
	lost := copyMsg("silent.x", "id-5")
	failed, err, ok = c.wait(ctx, c.publish([]*nats.Msg{copyMsg("copies.d", "id-6"), lost}), 300*time.Millisecond)
	require.True(t, ok)
	require.Equal(t, []*nats.Msg{lost}, msgsOf(failed), "only the unanswered copy failed")
	require.ErrorContains(t, err, "no publish ack within")

	// An ack for a set already given up on is dropped; nothing breaks.
	c.onAck(&nats.Msg{Subject: c.inbox + "1.0", Data: []byte(`{"stream":"COPIES","seq":1}`)})

	ctxDone, cancel := context.WithCancel(ctx)
	cancel()
	_, _, ok = c.wait(ctxDone, c.publish([]*nats.Msg{copyMsg("silent.x", "id-7")}), 5*time.Second)
	require.False(t, ok, "a cancelled wait reports it")
}

// A lost connection fails the copies waiting for their acks at once, not
// after the publish timeout.
func TestCopierFailsWaitingCopiesWhenTheConnectionDrops(t *testing.T) {
	t.Parallel()
	ns, nc, c, _ := newTestCopier(t)
	sub, err := nc.SubscribeSync("silent.x")
	require.NoError(t, err)
	defer sub.Unsubscribe()
	require.NoError(t, nc.Flush())

	set := c.publish([]*nats.Msg{copyMsg("silent.x", "id-1")})
	ns.Shutdown()
	start := time.Now()
	failed, werr, ok := c.wait(context.Background(), set, time.Minute)
	require.True(t, ok)
	require.Len(t, failed, 1)
	require.ErrorContains(t, werr, "connection reconnecting")
	require.Less(t, time.Since(start), 30*time.Second, "the disconnect, not the timeout, ended the wait")
}

// The copies' own connection buffers nothing while it reconnects: a copy
// published while the server is down fails at once, and never reaches the
// restarted server ahead of the copies a loss took, to be put back first.
// Switch: keep nc's ReconnectBufSize in copiesConn: the copy is stored.
func TestCopiesConnectionSendsNothingAfterAReconnectThatWasPublishedBefore(t *testing.T) {
	t.Parallel()
	ns, nc, _, _ := newTestCopier(t)
	cc, err := copiesConn(nc)
	require.NoError(t, err)
	t.Cleanup(cc.Close)

	ns.Shutdown()
	require.Eventually(t, func() bool { return !cc.IsConnected() }, 10*time.Second, 10*time.Millisecond)
	late := cc.PublishMsg(copyMsg("copies.a", "id-late"))
	ns.Restart(t)
	require.Eventually(t, cc.IsConnected, 20*time.Second, 10*time.Millisecond)
	require.NoError(t, cc.Flush())

	ctx := context.Background()
	st, err := ns.JetStream(t).Stream(ctx, "COPIES")
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.State.Msgs, "a copy published while disconnected was stored after the reconnect")
	require.Error(t, late, "the publish while disconnected failed at once")
}

// A publish ack is the server's, but read it as hostile input: neither
// reader panics, and the sequence read without a JSON decoder is the one
// JSON gives for every ack the copier counts as stored.
func FuzzPubAck(f *testing.F) {
	for _, s := range []string{`{"stream":"LEDGER_LOG","seq":17}`, `{"stream":"S","seq":3,"duplicate": true}`,
		`{"stream":"S","domain":"d","seq":18446744073709551615}`, `{"error":{"code":400,"err_code":10071}}`,
		`{"stream":"S","seq": 42}`, `{"stream":"S"}`, ``, `{"stream":"S","seq":-1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m := &nats.Msg{Data: data}
		err := pubAckError(m)
		seq := pubAckSeq(data)
		if err != nil || strings.Count(string(data), `"seq"`) != 1 {
			return
		}
		var ack struct {
			Seq *uint64 `json:"seq"`
		}
		if json.Unmarshal(data, &ack) != nil || ack.Seq == nil || *ack.Seq > 1<<62 {
			return
		}
		if seq != *ack.Seq {
			t.Fatalf("pubAckSeq(%q) = %d, JSON says %d", data, seq, *ack.Seq)
		}
	})
}
