package fsutil

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/shoenig/test/must"
)

func TestWriteFileAtomic(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	must.NoError(t, WriteFileAtomic(path, []byte("one"), 0o600))
	must.NoError(t, WriteFileAtomic(path, []byte("two"), 0o600))
	got, err := os.ReadFile(path)
	must.NoError(t, err)
	must.Eq(t, "two", string(got))
	_, err = os.Stat(path + ".tmp")
	must.True(t, os.IsNotExist(err))
	info, err := os.Stat(path)
	must.NoError(t, err)
	must.Eq(t, os.FileMode(0o600), info.Mode().Perm())

	must.Error(t, WriteFileAtomic(filepath.Join(t.TempDir(), "missing", "f"), nil, 0o600))
}
