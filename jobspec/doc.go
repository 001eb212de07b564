// Package jobspec turns job files into structs.Job.
//
// Two shapes are read: Nomad-style HCL job files (ParseHCL) and the JSON
// that Nomad's HTTP API and its Go client send (ParseJSON). Both refuse,
// by name, anything Roam would otherwise ignore: a job that asks for a
// network, a service or an update strategy must not be accepted and then
// run without it. Both return jobs that are defaulted and validated;
// every error wraps structs.ErrInvalidRequest.
package jobspec
