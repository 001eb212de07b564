package structs

import (
	"context"
	"net/rpc"
	"reflect"
)

// CallContext makes an RPC on c that the caller may abandon when ctx ends.
// net/rpc still decodes a late reply into whatever value it was given, so
// the call decodes into a fresh value and copies it into reply only on
// success: an abandoned call never writes to the caller's reply. The
// returned error is ctx.Err() when ctx ended first, else the call's own
// error, unmapped.
func CallContext(ctx context.Context, c *rpc.Client, method string, args, reply any) error {
	out := reflect.ValueOf(reply)
	tmp := reflect.New(out.Type().Elem())
	call := c.Go(method, args, tmp.Interface(), make(chan *rpc.Call, 1))
	select {
	case <-call.Done:
		if call.Error == nil {
			out.Elem().Set(tmp.Elem())
		}
		return call.Error
	case <-ctx.Done():
		return ctx.Err()
	}
}
