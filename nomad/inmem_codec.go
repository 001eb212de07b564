package nomad

import (
	"context"
	"errors"
	"net/rpc"
	"reflect"
)

// inmemCodec serves one in-process call through the same net/rpc dispatch
// as remote calls, without encoding: the agent's HTTP API uses it to reach
// its own server.
type inmemCodec struct {
	// ctx, when set, is the caller's: a blocking query ends with it.
	ctx    context.Context
	method string
	args   any
	reply  any
	err    error
}

func (c *inmemCodec) ReadRequestHeader(req *rpc.Request) error {
	req.ServiceMethod = c.method
	return nil
}

func (c *inmemCodec) ReadRequestBody(body any) error {
	if body == nil {
		return nil
	}
	src := reflect.Indirect(reflect.ValueOf(c.args))
	dst := reflect.Indirect(reflect.ValueOf(body))
	if src.Type() != dst.Type() {
		return errors.New("rpc: argument type " + src.Type().String() + " does not match " + dst.Type().String())
	}
	dst.Set(src)
	if cs, ok := body.(contextSetter); ok && c.ctx != nil {
		cs.SetContext(c.ctx)
	}
	return nil
}

func (c *inmemCodec) WriteResponse(resp *rpc.Response, body any) error {
	if resp.Error != "" {
		// The coded wire form, as a remote caller gets it: Server.RPC
		// decodes it with FromRPCError like every other receiving path,
		// so in-process and remote callers see the same errors.
		c.err = rpc.ServerError(resp.Error)
		return nil
	}
	src := reflect.Indirect(reflect.ValueOf(body))
	dst := reflect.Indirect(reflect.ValueOf(c.reply))
	if src.Type() != dst.Type() {
		c.err = errors.New("rpc: reply type " + src.Type().String() + " does not match " + dst.Type().String())
		return nil
	}
	dst.Set(src)
	return nil
}

func (c *inmemCodec) Close() error { return nil }
