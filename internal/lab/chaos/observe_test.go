package chaos

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// markWouldReject sets what enforce would have answered on id's row and,
// unless copies is false, on its log copies.
func (s *story) markWouldReject(id, w string, copies bool) {
	for i := range s.h.Events {
		if s.h.Events[i].EventID == id {
			s.h.Events[i].WouldReject = w
		}
	}
	if !copies {
		return
	}
	for i := range s.h.Log {
		if s.h.Log[i].EventID == id {
			s.h.Log[i].WouldReject = w
		}
	}
}

// observed is the takeover story on a partition in the observe fence
// mode: the zombie's version 4 commits, marked stale/superseded, where an
// enforce run refuses it.
func observed() *story {
	s := newStory()
	s.h.Observing = map[int]bool{0: true}
	s.grant("w-a", 1, 100)
	s.send("w-a", "e1", "t1", 1, 1, 110, true)
	s.grant("w-b", 2, 2000)
	s.send("w-b", "e2", "t1", 2, 2, 2010, true)
	s.send("w-a", "e3", "t1", 3, 1, 2500, true)
	s.commit("e1")
	s.commit("e2")
	s.commit("e3")
	return s
}

// The checker in observe mode counts the would-be-stale commits where an
// enforce run counts its stale refusals, and holds the shadow fence to its
// word: a stale send that commits must say would_reject, a commit on an
// enforcing partition must not, and no log copy may say what its row does
// not.
func TestCheckerCountsWouldBeStaleCommitsInObserve(t *testing.T) {
	t.Parallel()
	s := observed()
	s.markWouldReject("e3", "stale/superseded", true)
	s.project(t)
	r := Check(s.h)
	assert.Empty(t, counts(r), "%+v", r.Violations)
	assert.True(t, r.Observe)
	assert.Equal(t, 1, r.StaleSends)
	assert.Equal(t, map[string]int{"stale/superseded": 1}, r.WouldReject, "counted where enforce counts its refusal")
	assert.Equal(t, 1, r.WouldRejectStaleSends)
	assert.Zero(t, r.Rejections["stale"], "nothing was refused")
	line := CheckLine(r)
	assert.Contains(t, line, "would_reject={stale/superseded:1} would_reject_stale_sends=1")

	for _, c := range []struct {
		name   string
		mutate func(s *story)
		want   map[ViolationKind]int
		detail string
	}{
		{"a stale send committed without would_reject", func(s *story) {}, map[ViolationKind]int{StaleCommit: 1},
			"committed under observe"},
		{"a would_reject commit on a partition that enforces", func(s *story) {
			s.markWouldReject("e3", "stale/superseded", true)
			s.h.Observing = nil
		}, map[ViolationKind]int{StaleCommit: 2}, "generation 1 committed"},
		{"a log copy says would_reject, its row does not", func(s *story) {
			s.markWouldReject("e3", "stale/superseded", true)
			s.markWouldReject("e2", "", false)
			for i := range s.h.Log {
				if s.h.Log[i].EventID == "e2" {
					s.h.Log[i].WouldReject = "stale/not_holder"
				}
			}
		}, map[ViolationKind]int{LogOutOfOrder: 1}, `says would_reject "stale/not_holder"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := observed()
			c.mutate(s)
			s.project(t)
			r := Check(s.h)
			assert.Equal(t, c.want, counts(r), "%+v", r.Violations)
			if assert.NotEmpty(t, r.Violations) {
				assert.True(t, strings.Contains(r.Violations[0].Detail, c.detail), "%q lacks %q", r.Violations[0].Detail, c.detail)
			}
		})
	}
}
