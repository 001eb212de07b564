// Package client is the Roam client agent: it registers its node with the
// servers, heartbeats over one yamux session to one server at a time, and
// fails over to another server when that one stops answering. It talks to
// the servers only through structs types and RPC, never through nomad/ or
// state/.
package client
