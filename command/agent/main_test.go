package agent

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"testing"

	"github.com/roamhq/roam/client/driver/rawexec"
)

// testHTTPServeEnv makes the test binary a task that answers HTTP on its
// NOMAD_ADDR_http with its NOMAD_ALLOC_ID, until killed: a workload with a
// port, without anything the machine may lack.
const testHTTPServeEnv = "ROAM_TEST_HTTP_SERVE"

// The test binary doubles as the raw_exec executor, so test agents run
// real tasks, and as an HTTP task.
func TestMain(m *testing.M) {
	if os.Getenv(testHTTPServeEnv) != "" {
		os.Exit(serveTestHTTP())
	}
	os.Exit(rawexec.RunTestMain(m))
}

func serveTestHTTP() int {
	l, err := net.Listen("tcp", os.Getenv("NOMAD_ADDR_http"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	id := os.Getenv("NOMAD_ALLOC_ID")
	err = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, id) }))
	fmt.Fprintln(os.Stderr, err)
	return 1
}
