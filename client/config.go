package client

import (
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/roamhq/roam/structs"
)

// Config configures a client.
type Config struct {
	// DataDir keeps the node's identity across restarts. Required.
	DataDir    string
	NodeName   string
	Region     string
	Datacenter string
	NodeClass  string
	Meta       map[string]string
	// HTTPAddr is the agent's advertised HTTP address, recorded on the node.
	HTTPAddr string

	// Servers are RPC addresses of servers to try, in order.
	Servers []string

	// RPCRetryTimeout bounds how long RPC keeps retrying retryable errors
	// (no leader, server unreachable) before giving up.
	RPCRetryTimeout time.Duration
	// MinRetryBackoff and MaxRetryBackoff bound the jittered waits between
	// attempts.
	MinRetryBackoff time.Duration
	MaxRetryBackoff time.Duration
	// DialTimeout bounds one connection attempt.
	DialTimeout time.Duration

	// ExecutorPath is the binary the raw_exec driver runs as
	// `<path> executor <spec>` to supervise a task; empty means this
	// process's own executable (the roam binary).
	ExecutorPath string
	// VolumeHook mounts group volumes before tasks start; nil means an
	// allocation that requests volumes fails.
	VolumeHook VolumeHook

	Logger hclog.Logger
}

// DefaultConfig returns a client configuration with production timers;
// DataDir and Servers must still be set.
func DefaultConfig() *Config {
	return &Config{
		Region:          structs.DefaultRegion,
		Datacenter:      "dc1",
		RPCRetryTimeout: 30 * time.Second,
		MinRetryBackoff: 50 * time.Millisecond,
		MaxRetryBackoff: 2 * time.Second,
		DialTimeout:     5 * time.Second,
		Logger:          hclog.NewNullLogger(),
	}
}

// Validate names the first bad value.
func (c *Config) Validate() error {
	switch {
	case c.DataDir == "":
		return errors.New("client config: data_dir is required")
	case len(c.Servers) == 0:
		return errors.New("client config: at least one server address is required")
	case c.Datacenter == "":
		return errors.New("client config: datacenter must be set")
	case c.RPCRetryTimeout <= 0:
		return fmt.Errorf("client config: rpc retry timeout = %s, must be positive", c.RPCRetryTimeout)
	case c.MinRetryBackoff <= 0 || c.MaxRetryBackoff < c.MinRetryBackoff:
		return fmt.Errorf("client config: retry backoff %s..%s is not a valid range", c.MinRetryBackoff, c.MaxRetryBackoff)
	case c.DialTimeout <= 0:
		return fmt.Errorf("client config: dial timeout = %s, must be positive", c.DialTimeout)
	}
	return nil
}

// copy returns a copy the client may fill defaults into without changing
// the caller's value.
func (c *Config) copy() *Config {
	n := *c
	n.Servers = append([]string(nil), c.Servers...)
	if c.Meta != nil {
		n.Meta = make(map[string]string, len(c.Meta))
		for k, v := range c.Meta {
			n.Meta[k] = v
		}
	}
	return &n
}
