package nomad

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// gateOnPipe runs awaitRaftFrame on one end of a pipe while send writes
// chunks to the other, and returns its result.
func gateOnPipe(t *testing.T, timeout time.Duration, chunks ...[]byte) (net.Conn, net.Conn, error) {
	t.Helper()
	server, client := net.Pipe()
	t.Cleanup(func() { _ = server.Close(); _ = client.Close() })
	go func() {
		for _, c := range chunks {
			if _, err := client.Write(c); err != nil {
				return
			}
		}
	}()
	conn, err := awaitRaftFrame(server, timeout)
	return conn, client, err
}

func TestAwaitRaftFrame_ReplaysWhatItHeld(t *testing.T) {
	vote := raftBytes(t, 1, &raft.RequestVoteRequest{Term: 1, Candidate: []byte("x")})
	entries := func(size int) []byte {
		return raftBytes(t, 0, &raft.AppendEntriesRequest{Term: 2, Entries: []*raft.Log{
			{Index: 1, Term: 2, Type: raft.LogCommand, Data: bytes.Repeat([]byte("x"), size), AppendedAt: time.Now()},
		}})
	}
	cases := map[string][][]byte{
		"one small frame":             {vote},
		"a frame in pieces":           {vote[:3], vote[3:7], vote[7:]},
		"a frame larger than 512":     {entries(5000)},
		"a frame over the gate's cap": {entries(3 * raftGateMax)},
		"a frame, then the next":      {vote, entries(100)},
	}
	for name, chunks := range cases {
		t.Run(name, func(t *testing.T) {
			conn, _, err := gateOnPipe(t, time.Minute, chunks...)
			must.NoError(t, err)
			want := bytes.Join(chunks, nil)
			got := make([]byte, len(want))
			_, err = io.ReadFull(conn, got)
			must.NoError(t, err)
			must.Eq(t, want, got)
		})
	}
}

func TestAwaitRaftFrame_PartialFrameTimesOut(t *testing.T) {
	t.Parallel()
	vote := raftBytes(t, 1, &raft.RequestVoteRequest{Term: 1, Candidate: []byte("x")})
	for name, data := range map[string][]byte{
		"type byte only":    {0},
		"part of a request": vote[:len(vote)/2],
		"storm's partial":   {0x00, 0x8f, 0xa4, 'T', 'e'},
	} {
		t.Run(name, func(t *testing.T) {
			conn, _, err := gateOnPipe(t, 100*time.Millisecond, data)
			must.Nil(t, conn)
			must.ErrorIs(t, err, os.ErrDeadlineExceeded)
		})
	}
}

func TestAwaitRaftFrame_IdleBeforeFirstByte(t *testing.T) {
	t.Parallel()
	server, client := net.Pipe()
	t.Cleanup(func() { _ = client.Close() })
	done := make(chan error, 1)
	go func() {
		_, err := awaitRaftFrame(server, 50*time.Millisecond)
		done <- err
	}()
	// Many frame timeouts without a byte: still waiting.
	select {
	case err := <-done:
		t.Fatalf("an idle connection ended before its first byte: %v", err)
	case <-time.After(10 * 50 * time.Millisecond):
	}
	_ = server.Close()
	err := <-done
	must.Error(t, err)
	must.False(t, errors.Is(err, os.ErrDeadlineExceeded))
}

// TestConn_RaftPartialFrameNeverReachesRaft: a connection that names the
// Raft protocol and stalls inside its first frame is closed at the frame
// timeout without Raft's transport ever serving it (which costs a 256 KiB
// buffer and a goroutine per connection); a whole frame still reaches Raft.
func TestConn_RaftPartialFrameNeverReachesRaft(t *testing.T) {
	t.Parallel()
	srv := testServer(t, func(c *Config) {
		withLongHeartbeats(c)
		c.RPCFrameTimeout = 300 * time.Millisecond
	})
	waitForLeaderDuties(t, srv)
	// A lone server dials nobody, and nobody dials it but the test.
	before := srv.raftLayer.handedOff.Load()

	vote := raftBytes(t, 1, &raft.RequestVoteRequest{Term: 1, Candidate: []byte("x")})
	for _, data := range [][]byte{{0}, vote[:len(vote)/2], {0x00, 0x8f, 0xa4, 'T', 'e'}} {
		requireConnClosed(t, rawConn(t, srv, append([]byte{structs.RPCRaft}, data...)...))
	}
	must.Eq(t, before, srv.raftLayer.handedOff.Load(), must.Sprint("partial Raft frames were handed to Raft"))

	rawConn(t, srv, append([]byte{structs.RPCRaft}, vote...)...)
	must.Wait(t, wait.InitialSuccess(
		wait.BoolFunc(func() bool { return srv.raftLayer.handedOff.Load() == before+1 }),
		wait.Timeout(5*time.Second), wait.Gap(10*time.Millisecond),
	), must.Sprint("a whole Raft frame did not reach Raft"))
}
