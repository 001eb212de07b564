//go:build e2e && !linux

package e2e

import "errors"

// fsWatch needs inotify; elsewhere the sentinel is checked only after the
// fact.
type fsWatch struct{}

func watchFS(dirs []string, names []string, whole []string) (*fsWatch, error) {
	return nil, errors.New("no inotify on this system")
}

func (w *fsWatch) events() []string { return nil }
func (w *fsWatch) close()           {}
