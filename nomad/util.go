package nomad

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

type atomicBool = atomic.Bool

// advertiseAddr is a net.Addr for an advertised host:port string.
type advertiseAddr string

func (a advertiseAddr) Network() string { return "tcp" }
func (a advertiseAddr) String() string  { return string(a) }

var _ net.Addr = advertiseAddr("")

// jitter returns d plus a random fraction of d up to 1/frac.
func jitter(d time.Duration, frac int64) time.Duration {
	if d <= 0 || frac <= 0 {
		return d
	}
	return d + time.Duration(rand.Int64N(int64(d)/frac+1))
}

// hclogYamux adapts hclog to yamux's logger interface.
type hclogYamux struct{ l hclog.Logger }

func (y hclogYamux) Print(v ...any) { y.l.Debug(strings.TrimSpace(fmt.Sprint(v...))) }
func (y hclogYamux) Printf(format string, v ...any) {
	y.l.Debug(strings.TrimSpace(fmt.Sprintf(format, v...)))
}
func (y hclogYamux) Println(v ...any) { y.l.Debug(strings.TrimSpace(fmt.Sprint(v...))) }
