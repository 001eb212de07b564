// Package testutil starts what tests outside the server package need: a
// server, a cluster of servers, and a sink for an agent's log. Every
// helper takes a testing.TB, stops what it started in t.Cleanup, and
// waits on conditions rather than on the clock.
//
// It sits at the top of the tree rather than in internal/, whose packages
// import nothing of ours. It imports the server (nomad) and nothing above
// it, so the client and agent packages can use it from their own
// in-package tests. The server's
// own tests cannot: they live in package nomad, and a package that
// imports nomad cannot be imported back by it. They keep their helpers in
// nomad/testing_test.go and nomad/memcluster_test.go, which also build
// clusters on the in-memory network; the shared piece, the test server
// configuration, is nomad.TestConfig, used by both.
package testutil
