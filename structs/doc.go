// Package structs holds every type that crosses the wire or lives in the
// state store: nodes, request/response pairs, error values and the msgpack
// handle. It does no I/O and imports nothing of Roam's.
package structs
