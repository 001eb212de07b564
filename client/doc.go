// Package client is the Roam client agent: it registers its node with the
// servers, heartbeats over one yamux session to one server at a time, and
// fails over to another server when that one stops answering. It runs the
// allocations the servers assign it (allocwatcher, allocrunner,
// taskrunner), keeps what it runs in a local bbolt database so a restarted
// client re-attaches to its tasks (statedb), and reports their status back
// in batches (allocupdater). It talks to
// the servers only through structs types and RPC, never through nomad/ or
// state/.
package client
