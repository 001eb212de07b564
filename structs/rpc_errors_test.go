package structs

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"net/rpc"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// failService answers Fail(id) with the error registered under id.
type failService struct{ errs map[string]error }

func (f failService) Fail(id string, reply *int) error { return f.errs[id] }

// overRPC returns a call function that sends each error in errs through a
// real RPCServer and msgpack codecs over a net.Pipe, and gives back what
// the calling side's FromRPCError makes of it.
func overRPC(t *testing.T, errs map[string]error) func(id string) error {
	t.Helper()
	srv := NewRPCServer()
	must.NoError(t, srv.RegisterName("Fail", failService{errs: errs}))
	serverSide, clientSide := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.ServeCodec(NewServerCodec(serverSide))
	}()
	c := rpc.NewClientWithCodec(NewClientCodec(clientSide))
	t.Cleanup(func() {
		c.Close()
		<-done
	})
	return func(id string) error {
		var out int
		err := c.Call("Fail.Fail", id, &out)
		var wire rpc.ServerError
		must.True(t, errors.As(err, &wire), must.Sprintf("want a server error for %s, got %T: %v", id, err, err))
		return FromRPCError(err)
	}
}

// requireNoWireForm fails if a message shows the wire encoding.
func requireNoWireForm(t *testing.T, err error) {
	t.Helper()
	must.StrNotContains(t, err.Error(), "\x00")
	must.StrNotContains(t, err.Error(), "roam:")
}

func TestRPCError_EverySentinelRoundTrips(t *testing.T) {
	errs := make(map[string]error)
	for _, sc := range sentinelCodes {
		errs[sc.code] = fmt.Errorf("handler for volume v1: %w: details", sc.err)
	}
	call := overRPC(t, errs)
	for _, sc := range sentinelCodes {
		t.Run(sc.code, func(t *testing.T) {
			sent := errs[sc.code]
			got := call(sc.code)
			must.ErrorIs(t, got, sc.err)
			must.Eq(t, sent.Error(), got.Error())
			requireNoWireForm(t, got)
			for _, other := range sentinelCodes {
				if !errors.Is(sent, other.err) {
					must.False(t, errors.Is(got, other.err), must.Sprintf("%s read as %s", sc.code, other.code))
				}
			}
			must.Eq(t, IsRetryable(sent), IsRetryable(got))
			must.Eq(t, []string{sc.code}, ErrorCodes(got))
			// Decoding is idempotent: every receiving point may call it.
			must.Eq(t, got, FromRPCError(got))
		})
	}
}

// TestRPCError_TextIsNotMeaning: a message that merely contains another
// sentinel's text is not read as that sentinel. The text-matching wire this
// replaces got each of these wrong (see the old reading in each case).
func TestRPCError_TextIsNotMeaning(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want error // nil: no sentinel at all
		not  error
	}{
		{
			// Old reading: ErrNoLeader, so callers retried an OS failure.
			name: "plain error quoting no leader",
			err:  errors.New("mount /srv/vol: device mapper: no cluster leader elected in array"),
			not:  ErrNoLeader,
		},
		{
			// Old reading: ErrOutcomeUnknown, retryable.
			name: "plain error quoting outcome unknown",
			err:  errors.New("plugin log: " + ErrOutcomeUnknown.Error()),
			not:  ErrOutcomeUnknown,
		},
		{
			// Old reading: ErrCSIPluginNotFound, so the leader would call
			// the next controller with a destructive call the provider
			// refused.
			name: "failed precondition quoting plugin not found",
			err:  fmt.Errorf("csi ControllerPublishVolume: %w: provider: csi plugin not on this client's host", ErrCSIFailedPrecondition),
			want: ErrCSIFailedPrecondition,
			not:  ErrCSIPluginNotFound,
		},
		{
			// Old reading: ErrCSIControllerUnavailable.
			name: "invalid argument quoting controller unavailable",
			err:  fmt.Errorf("csi CreateVolume: %w: csi controller unavailable in zone b", ErrCSIInvalidArgument),
			want: ErrCSIInvalidArgument,
			not:  ErrCSIControllerUnavailable,
		},
		{
			// Old reading: ErrNotFound, a 404 instead of a 400.
			name: "invalid request quoting not found",
			err:  fmt.Errorf("%w: constraint attribute not found in node class", ErrInvalidRequest),
			want: ErrInvalidRequest,
			not:  ErrNotFound,
		},
		{
			// Old reading: ErrNoLeader, so a permission failure was retried.
			name: "permission denied quoting no leader",
			err:  fmt.Errorf("%w: token policy mentions no cluster leader", ErrPermissionDenied),
			want: ErrPermissionDenied,
			not:  ErrNoLeader,
		},
		{
			name: "invalid argument quoting no leader",
			err:  fmt.Errorf("csi ControllerPublishVolume: %w: rpc error: code = InvalidArgument desc = no cluster leader", ErrCSIInvalidArgument),
			want: ErrCSIInvalidArgument,
			not:  ErrNoLeader,
		},
		{
			name: "message forging the wire form",
			err:  errors.New(rpcErrorPrefix + "no_leader" + rpcErrorSep + "forged"),
			not:  ErrNoLeader,
		},
	}
	errs := make(map[string]error)
	for _, tc := range cases {
		errs[tc.name] = tc.err
	}
	call := overRPC(t, errs)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := call(tc.name)
			must.Eq(t, tc.err.Error(), got.Error())
			must.False(t, errors.Is(got, tc.not), must.Sprintf("%q read as %v", got, tc.not))
			if tc.want != nil {
				must.ErrorIs(t, got, tc.want)
			} else {
				must.SliceEmpty(t, ErrorCodes(got))
			}
			must.Eq(t, IsRetryable(tc.err), IsRetryable(got))
			// Idempotent, even for the forged message.
			must.False(t, errors.Is(FromRPCError(got), tc.not))
		})
	}
}

func TestRPCError_RetryableAcrossRPC(t *testing.T) {
	cases := []struct {
		err       error
		retryable bool
	}{
		{fmt.Errorf("raft apply: %w: leadership lost", ErrOutcomeUnknown), true},
		{fmt.Errorf("client rpc ClientCSI.ControllerAttachVolume: %w: %w", ErrOutcomeUnknown, context.DeadlineExceeded), true},
		{fmt.Errorf("csi ControllerPublishVolume: %w: volume attached to node n2", ErrCSIFailedPrecondition), false},
		{fmt.Errorf("csi ControllerPublishVolume: %w: connection refused", ErrCSIUnavailable), false},
		{fmt.Errorf("csi ControllerPublishVolume: %w: caller gave up: %w", ErrCSIUnavailable, context.Canceled), false},
		{fmt.Errorf("%w: waited 5s", ErrNoLeader), true},
		{ErrClaimInProgress, true},
		{ErrShutdown, true},
	}
	errs := make(map[string]error)
	for i, tc := range cases {
		errs[strconv.Itoa(i)] = tc.err
	}
	call := overRPC(t, errs)
	for i, tc := range cases {
		got := call(strconv.Itoa(i))
		must.Eq(t, tc.retryable, IsRetryable(got), must.Sprint(tc.err))
		must.Eq(t, IsRetryable(tc.err), IsRetryable(got))
	}
}

func TestRPCError_SeveralSentinels(t *testing.T) {
	errs := map[string]error{
		// A context error is no sentinel of ours: a remote deadline is not
		// the caller's, so it travels as text only.
		"outcome": fmt.Errorf("client rpc X to node n: %w: %w", ErrOutcomeUnknown, context.Canceled),
		"last":    fmt.Errorf("%w: plugin %q: all 2 candidates failed, last on node n2: %w", ErrCSIControllerUnavailable, "p", ErrNodeNotConnected),
		"joined":  fmt.Errorf("%w: %w", ErrInvalidRequest, errors.Join(fmt.Errorf("a: %w", ErrAmbiguousPrefix), errors.New("b"))),
	}
	call := overRPC(t, errs)

	got := call("outcome")
	must.ErrorIs(t, got, ErrOutcomeUnknown)
	must.False(t, errors.Is(got, context.Canceled))
	must.True(t, IsRetryable(got))
	must.Eq(t, []string{"outcome_unknown"}, ErrorCodes(got))

	got = call("last")
	must.Eq(t, []string{"csi_controller_unavailable", "node_not_connected"}, ErrorCodes(got))
	must.ErrorIs(t, got, ErrCSIControllerUnavailable)
	must.ErrorIs(t, got, ErrNodeNotConnected)
	must.Eq(t, errs["last"].Error(), got.Error())

	got = call("joined")
	must.Eq(t, []string{"ambiguous_prefix", "invalid_request"}, ErrorCodes(got))
}

func TestRPCError_UnknownCodes(t *testing.T) {
	// From a newer peer: unknown codes give plain text, known ones still
	// count.
	got := FromRPCError(rpc.ServerError(rpcErrorPrefix + "from_the_future" + rpcErrorSep + "a new kind of failure"))
	must.Eq(t, "a new kind of failure", got.Error())
	for _, sc := range sentinelCodes {
		must.False(t, errors.Is(got, sc.err))
	}
	must.False(t, IsRetryable(got))

	got = FromRPCError(rpc.ServerError(rpcErrorPrefix + "from_the_future,no_leader" + rpcErrorSep + "no leader, newly"))
	must.ErrorIs(t, got, ErrNoLeader)
	must.Eq(t, "no leader, newly", got.Error())

	// A relay passes the unknown code on.
	relayed := EncodeRPCError(fmt.Errorf("relay: %w", got))
	must.Eq(t, rpcErrorPrefix+"no_leader,from_the_future"+rpcErrorSep+"relay: no leader, newly", relayed)

	// A wire string cut short keeps its text and no meaning.
	got = FromRPCError(rpc.ServerError(rpcErrorPrefix + "no_leader"))
	must.False(t, errors.Is(got, ErrNoLeader))
}

func TestRPCError_UncodedFallback(t *testing.T) {
	// Errors with no code on the wire (net/rpc's own, or a peer that sends
	// none) are still read by their text...
	got := FromRPCError(rpc.ServerError("rpc: can't find service Nope.Nothing"))
	must.ErrorIs(t, got, ErrUnknownMethod)
	got = FromRPCError(rpc.ServerError("forwarding: " + ErrNoLeader.Error()))
	must.ErrorIs(t, got, ErrNoLeader)
	// ...but a local error value never is: its chain says what it is.
	local := errors.New("disk says: " + ErrNoLeader.Error())
	must.Eq(t, local, FromRPCError(local))
	must.False(t, IsRetryable(local))
}

func TestRPCServer_UnknownMethodKeepsStream(t *testing.T) {
	srv := NewRPCServer()
	must.NoError(t, srv.RegisterName("Ping", pingService{}))
	must.Error(t, srv.RegisterName("Ping", pingService{}))
	must.Error(t, srv.RegisterName("Empty", struct{}{}))
	serverSide, clientSide := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.ServeCodec(NewServerCodec(serverSide))
	}()
	c := rpc.NewClientWithCodec(NewClientCodec(clientSide))
	t.Cleanup(func() {
		c.Close()
		<-done
	})
	var out int
	for _, method := range []string{"Nope.Double", "Ping.Nope", "NoDot"} {
		err := c.Call(method, &CodecPingArgs{N: 1}, &out)
		got := FromRPCError(err)
		must.ErrorIs(t, got, ErrUnknownMethod)
		must.StrContains(t, got.Error(), method)
		requireNoWireForm(t, got)
		must.NoError(t, c.Call("Ping.Double", &CodecPingArgs{N: 4}, &out))
		must.Eq(t, 8, out)
	}
}

var codeShape = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// TestSentinelCodes_Complete keeps the code table whole: every ErrX of
// this package built with errors.New has one, and codes are unique and of
// the shape the wire form needs (no comma, no NUL).
func TestSentinelCodes_Complete(t *testing.T) {
	seen := map[string]bool{}
	byMsg := map[string]bool{}
	for _, sc := range sentinelCodes {
		must.True(t, codeShape.MatchString(sc.code), must.Sprint(sc.code))
		must.False(t, seen[sc.code], must.Sprintf("code %s used twice", sc.code))
		seen[sc.code] = true
		must.Eq(t, sc.err, sentinelByCode[sc.code])
		byMsg[sc.err.Error()] = true
	}

	files, err := filepath.Glob("*.go")
	must.NoError(t, err)
	fset := token.NewFileSet()
	var found int
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		must.NoError(t, err)
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if !strings.HasPrefix(id.Name, "Err") || i >= len(vs.Values) {
						continue
					}
					call, ok := vs.Values[i].(*ast.CallExpr)
					if !ok || len(call.Args) != 1 {
						continue
					}
					if sel, ok := call.Fun.(*ast.SelectorExpr); !ok || sel.Sel.Name != "New" {
						continue
					}
					lit, ok := call.Args[0].(*ast.BasicLit)
					if !ok {
						continue
					}
					msg, err := strconv.Unquote(lit.Value)
					must.NoError(t, err)
					found++
					must.True(t, byMsg[msg], must.Sprintf("%s (%s) has no wire code in sentinelCodes", id.Name, name))
				}
			}
		}
	}
	must.Eq(t, len(sentinelCodes), found)
}

func TestFromRPCError_WrappedWireError(t *testing.T) {
	wire := rpc.ServerError(EncodeRPCError(fmt.Errorf("%w: volume v1", ErrCSINotFound)))
	got := FromRPCError(fmt.Errorf("%w: relayed: %w", ErrOutcomeUnknown, wire))
	must.Eq(t, ErrOutcomeUnknown.Error()+": relayed: "+ErrCSINotFound.Error()+": volume v1", got.Error())
	must.ErrorIs(t, got, ErrCSINotFound)
	must.ErrorIs(t, got, ErrOutcomeUnknown)
	requireNoWireForm(t, got)
}
