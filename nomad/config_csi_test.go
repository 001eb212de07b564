package nomad

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

func TestConfig_CSINodeDetachTimeout(t *testing.T) {
	must.Eq(t, time.Minute, DefaultConfig().CSINodeDetachTimeout)
	c := TestConfig(t)
	must.Positive(t, c.CSINodeDetachTimeout)
	must.NoError(t, c.Validate())
	c.CSINodeDetachTimeout = 0
	must.ErrorContains(t, c.Validate(), "csi node detach timeout")
}
