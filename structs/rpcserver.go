package structs

import (
	"fmt"
	"go/token"
	"net/rpc"
	"reflect"
	"sort"
	"strings"
	"sync"
)

// RPCServer serves calls to registered services over any rpc.ServerCodec,
// on net/rpc's wire: rpc.Client calls it, and methods have net/rpc's shape,
// func (T) Method(args A, reply *R) error.
//
// It differs from rpc.Server in what a failed call sends back: the
// handler's error in its coded form (EncodeRPCError), so the caller's
// FromRPCError gets back the sentinels the error wrapped and not only its
// text. rpc.Server reduces the error to its message before a codec sees
// it, which is why the coding lives here and not in a codec.
type RPCServer struct {
	mu       sync.RWMutex
	services map[string]*rpcService
	// authorize, when set, is asked about every call before its handler
	// runs; an error is the call's reply and the handler never runs.
	authorize func(method string, args any) error
}

// SetAuthorizer sets the check every call passes before its handler runs.
// Call it before serving.
func (s *RPCServer) SetAuthorizer(fn func(method string, args any) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.authorize = fn
}

// Methods lists every callable Service.Method, sorted.
func (s *RPCServer) Methods() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []string
	for name, svc := range s.services {
		for m := range svc.methods {
			out = append(out, name+"."+m)
		}
	}
	sort.Strings(out)
	return out
}

type rpcService struct {
	rcvr    reflect.Value
	methods map[string]*rpcMethod
}

type rpcMethod struct {
	fn        reflect.Value // the method's func; the receiver is its first argument
	argType   reflect.Type
	replyType reflect.Type // a pointer type
}

// NewRPCServer returns a server with no services.
func NewRPCServer() *RPCServer {
	return &RPCServer{services: make(map[string]*rpcService)}
}

var typeOfError = reflect.TypeFor[error]()

// RegisterName makes rcvr's methods of the net/rpc shape callable as
// name.Method. Other methods are ignored. It fails if rcvr has no such
// method or name is taken.
func (s *RPCServer) RegisterName(name string, rcvr any) error {
	if name == "" || strings.Contains(name, ".") {
		return fmt.Errorf("rpc: bad service name %q", name)
	}
	typ := reflect.TypeOf(rcvr)
	svc := &rpcService{rcvr: reflect.ValueOf(rcvr), methods: make(map[string]*rpcMethod)}
	for i := range typ.NumMethod() {
		m := typ.Method(i)
		if mt, ok := rpcMethodShape(m); ok {
			svc.methods[m.Name] = mt
		}
	}
	if len(svc.methods) == 0 {
		return fmt.Errorf("rpc: service %s (%s) has no exported method of the shape func(args, *reply) error", name, typ)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.services[name]; dup {
		return fmt.Errorf("rpc: service %s already registered", name)
	}
	s.services[name] = svc
	return nil
}

// rpcMethodShape reports whether m can serve calls, as net/rpc decides it:
// exported, two arguments of exported or built-in types, the second a
// pointer, and a single error result.
func rpcMethodShape(m reflect.Method) (*rpcMethod, bool) {
	t := m.Type
	if !m.IsExported() || t.NumIn() != 3 || t.NumOut() != 1 || t.Out(0) != typeOfError {
		return nil, false
	}
	arg, reply := t.In(1), t.In(2)
	if reply.Kind() != reflect.Pointer || !exportedOrBuiltin(arg) || !exportedOrBuiltin(reply) {
		return nil, false
	}
	return &rpcMethod{fn: m.Func, argType: arg, replyType: reply}, true
}

func exportedOrBuiltin(t reflect.Type) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return token.IsExported(t.Name()) || t.PkgPath() == ""
}

// lookup finds the method a request names.
func (s *RPCServer) lookup(serviceMethod string) (*rpcService, *rpcMethod, error) {
	dot := strings.LastIndex(serviceMethod, ".")
	if dot < 0 {
		return nil, nil, fmt.Errorf("%w %q: ill-formed, want Service.Method", ErrUnknownMethod, serviceMethod)
	}
	s.mu.RLock()
	svc := s.services[serviceMethod[:dot]]
	s.mu.RUnlock()
	if svc == nil {
		return nil, nil, fmt.Errorf("%w %s: no such service", ErrUnknownMethod, serviceMethod)
	}
	m := svc.methods[serviceMethod[dot+1:]]
	if m == nil {
		return nil, nil, fmt.Errorf("%w %s: no such method", ErrUnknownMethod, serviceMethod)
	}
	return svc, m, nil
}

// rpcCall is one request read from a codec.
type rpcCall struct {
	header rpc.Request
	svc    *rpcService
	method *rpcMethod
	argv   reflect.Value
	replyv reflect.Value
}

// readRequest reads the next request. With an error, a nil call means the
// stream is done (no header could be read); a non-nil one is owed an error
// reply, and the stream may go on.
func (s *RPCServer) readRequest(codec rpc.ServerCodec) (*rpcCall, error) {
	c := &rpcCall{}
	if err := codec.ReadRequestHeader(&c.header); err != nil {
		return nil, err
	}
	svc, m, err := s.lookup(c.header.ServiceMethod)
	if err != nil {
		// Read past the body so the stream stays at a frame boundary; a
		// codec that cannot ends the stream at its next header.
		_ = codec.ReadRequestBody(nil)
		return c, err
	}
	c.svc, c.method = svc, m
	argIsValue := m.argType.Kind() != reflect.Pointer
	if argIsValue {
		c.argv = reflect.New(m.argType)
	} else {
		c.argv = reflect.New(m.argType.Elem())
	}
	if err := codec.ReadRequestBody(c.argv.Interface()); err != nil {
		return c, err
	}
	if argIsValue {
		c.argv = c.argv.Elem()
	}
	c.replyv = reflect.New(m.replyType.Elem())
	switch m.replyType.Elem().Kind() {
	case reflect.Map:
		c.replyv.Elem().Set(reflect.MakeMap(m.replyType.Elem()))
	case reflect.Slice:
		c.replyv.Elem().Set(reflect.MakeSlice(m.replyType.Elem(), 0, 0))
	}
	return c, nil
}

// call runs the handler and writes its reply.
func (s *RPCServer) call(sending *sync.Mutex, codec rpc.ServerCodec, c *rpcCall) {
	s.mu.RLock()
	authorize := s.authorize
	s.mu.RUnlock()
	if authorize != nil {
		if err := authorize(c.header.ServiceMethod, c.argv.Interface()); err != nil {
			respond(sending, codec, &c.header, nil, err)
			return
		}
	}
	out := c.method.fn.Call([]reflect.Value{c.svc.rcvr, c.argv, c.replyv})
	var err error
	if e := out[0].Interface(); e != nil {
		err = e.(error)
	}
	respond(sending, codec, &c.header, c.replyv.Interface(), err)
}

// respond writes the reply to req: body on success, else err in its coded
// form and an empty body, as net/rpc's client expects. A failed write is
// the codec's to report: the connection is broken and its reader ends.
func respond(sending *sync.Mutex, codec rpc.ServerCodec, req *rpc.Request, body any, err error) {
	resp := &rpc.Response{ServiceMethod: req.ServiceMethod, Seq: req.Seq}
	if err != nil {
		resp.Error = EncodeRPCError(err)
		body = struct{}{}
	}
	sending.Lock()
	defer sending.Unlock()
	_ = codec.WriteResponse(resp, body)
}

// ServeCodec serves codec's requests, each in its own goroutine, until a
// request header cannot be read; then it waits for the replies in flight
// and closes the codec.
func (s *RPCServer) ServeCodec(codec rpc.ServerCodec) {
	var (
		sending sync.Mutex
		wg      sync.WaitGroup
	)
	for {
		c, err := s.readRequest(codec)
		if err != nil {
			if c == nil {
				break
			}
			respond(&sending, codec, &c.header, nil, err)
			continue
		}
		wg.Go(func() { s.call(&sending, codec, c) })
	}
	wg.Wait()
	_ = codec.Close()
}

// ServeRequest serves one request from codec, synchronously, and does not
// close it. It returns the error that kept the request from reaching its
// handler (after replying with it when a header was read); a handler's
// own error goes to the codec only.
func (s *RPCServer) ServeRequest(codec rpc.ServerCodec) error {
	var sending sync.Mutex
	c, err := s.readRequest(codec)
	if err != nil {
		if c != nil {
			respond(&sending, codec, &c.header, nil, err)
		}
		return err
	}
	s.call(&sending, codec, c)
	return nil
}
