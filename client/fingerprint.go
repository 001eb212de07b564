package client

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/roamhq/roam/structs"
)

// Version is the Roam version reported by clients.
const Version = structs.Version

// fingerprint returns the node's attributes: OS, architecture, CPU cores,
// memory and host name.
func fingerprint() map[string]string {
	attrs := map[string]string{
		"os.name":      runtime.GOOS,
		"kernel.name":  runtime.GOOS,
		"cpu.arch":     runtime.GOARCH,
		"cpu.numcores": strconv.Itoa(runtime.NumCPU()),
		"roam.version": Version,
	}
	if host, err := os.Hostname(); err == nil {
		attrs["unique.hostname"] = host
	}
	if mem := totalMemoryBytes(); mem > 0 {
		attrs["memory.totalbytes"] = strconv.FormatUint(mem, 10)
	}
	return attrs
}

// totalMemoryBytes reads MemTotal from /proc/meminfo; 0 when unknown.
func totalMemoryBytes() uint64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, err := strconv.ParseUint(fields[1], 10, 64)
			if err != nil {
				return 0
			}
			return kb * 1024
		}
	}
	return 0
}

// buildNode assembles the node this client registers.
func (c *Client) buildNode() *structs.Node {
	attrs := fingerprint()
	if c.localIP != "" {
		attrs["unique.network.ip-address"] = c.localIP
	}
	meta := make(map[string]string, len(c.config.Meta))
	for k, v := range c.config.Meta {
		meta[k] = v
	}
	drivers := c.drivers.infos(c.config.DisableRawExec, attrs)
	csiControllers, csiNodes := c.csi.Infos()
	lo, hi := c.config.dynamicPorts()
	return &structs.Node{
		ID:                   c.id.NodeID,
		SecretID:             c.id.SecretID,
		Name:                 c.config.NodeName,
		Datacenter:           c.config.Datacenter,
		NodeClass:            c.config.NodeClass,
		HTTPAddr:             c.config.HTTPAddr,
		Attributes:           attrs,
		Meta:                 meta,
		Drivers:              drivers,
		NodeResources:        &structs.NodeResources{MinDynamicPort: lo, MaxDynamicPort: hi},
		CSIControllerPlugins: csiControllers,
		CSINodePlugins:       csiNodes,
		Status:               structs.NodeStatusReady,
	}
}
