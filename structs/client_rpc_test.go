package structs

import (
	"fmt"
	"net"
	"net/rpc"
	"testing"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/shoenig/test/must"
)

func TestSession_NeverEncoded(t *testing.T) {
	with := &NodeUpdateStatusRequest{NodeID: "n1", Status: NodeStatusReady, WriteRequest: WriteRequest{Region: "r", AuthToken: "tok"}}
	with.SetSession(&struct{ secret string }{"session"})
	without := &NodeUpdateStatusRequest{NodeID: "n1", Status: NodeStatusReady, WriteRequest: WriteRequest{Region: "r", AuthToken: "tok"}}

	var a, b []byte
	must.NoError(t, codec.NewEncoderBytes(&a, MsgpackHandle).Encode(with))
	must.NoError(t, codec.NewEncoderBytes(&b, MsgpackHandle).Encode(without))
	must.Eq(t, b, a)

	var out NodeUpdateStatusRequest
	must.NoError(t, Decode(a, &out))
	must.Nil(t, out.Session())
	must.Eq(t, "tok", out.AuthToken)

	q := &NodeSpecificRequest{NodeID: "n1"}
	q.SetSession(1)
	must.Eq(t, any(1), q.Session())
	var qa, qb []byte
	must.NoError(t, codec.NewEncoderBytes(&qa, MsgpackHandle).Encode(q))
	must.NoError(t, codec.NewEncoderBytes(&qb, MsgpackHandle).Encode(&NodeSpecificRequest{NodeID: "n1"}))
	must.Eq(t, qb, qa)
}

func TestErrNodeNotConnected_OverRPC(t *testing.T) {
	err := FromRPCError(rpc.ServerError(fmt.Sprintf("%v: node abc", ErrNodeNotConnected)))
	must.ErrorIs(t, err, ErrNodeNotConnected)
	// The same call to the same node will not succeed soon; callers that
	// choose among nodes check for it explicitly.
	must.False(t, IsRetryable(err))
}

// CodecPingArgs (exported, as net/rpc requires) and pingService exercise
// NewServerCodec.
type CodecPingArgs struct{ N int }

type pingService struct{}

func (pingService) Double(args *CodecPingArgs, reply *int) error { *reply = 2 * args.N; return nil }

func TestServerCodec_EndsStreamOnBadBody(t *testing.T) {
	srv := NewRPCServer()
	must.NoError(t, srv.RegisterName("Ping", pingService{}))
	serverSide, clientSide := net.Pipe()
	t.Cleanup(func() { clientSide.Close() })
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.ServeCodec(NewServerCodec(serverSide))
	}()
	t.Cleanup(func() { <-done })

	c := rpc.NewClientWithCodec(NewClientCodec(clientSide))
	var out int
	must.NoError(t, c.Call("Ping.Double", &CodecPingArgs{N: 21}, &out))
	must.Eq(t, 42, out)

	// A body of the wrong shape: the server answers with an error and then
	// ends the stream, since it may no longer be at a frame boundary.
	err := c.Call("Ping.Double", "not a struct", &out)
	must.Error(t, err)
	err = c.Call("Ping.Double", &CodecPingArgs{N: 1}, &out)
	must.Error(t, err)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("server codec kept serving after an undecodable body")
	}
}
