// Package testutil is the one set of helpers for tests that need
// servers, a cluster, an agent or a client: start them and stop them in
// t.Cleanup, wait for a leader, put a cluster on an in-memory network
// that a test can cut and heal (MemNetwork), shorten a lone server's
// first election (LoneServerTimers), and send an agent's log to t.Log
// (LogWriter). Every helper takes a testing.TB and waits on conditions
// rather than on the clock.
//
// It imports neither the server (nomad) nor the agent: a caller passes
// the constructor (Start, StartCluster, StartMemServers) and the helpers
// work on small interfaces (Server, Stopper). That is what lets the
// server's own in-package tests use it: a package that imported nomad
// could not be imported back by nomad's tests. Each package keeps only
// the glue that turns its config into a started thing
// (nomad/testing_test.go, nomad/memcluster_test.go,
// client/testing_test.go, command/agent/testagent_test.go).
package testutil
