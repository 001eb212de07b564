package client

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/roamhq/roam/structs"
)

// The client builds paths from what the servers send: allocation IDs, task
// names, volume and plugin IDs. The servers check each with
// structs.ValidateID, but one written before they did, or sent by a server
// that did not, must still never lead outside the client's data dir. So
// every such path is built from components that pass structs.ValidateID
// here too (idPath), and what the client creates or removes beneath its
// data dir goes through an os.Root on the directory it must stay in
// (mkdirAllIn, removeAllIn), so that neither ".." nor a symbolic link
// planted beneath it (a task owns its task dir) leads out.

// pathPart is one component of a path idPath builds: an ID of the given
// kind, or, with no kind, a fixed name of the client's own layout.
type pathPart struct {
	kind, name string
}

// idOf is an ID-derived path component.
func idOf(kind, id string) pathPart { return pathPart{kind: kind, name: id} }

// fixed is a path component of the client's own layout.
func fixed(name string) pathPart { return pathPart{name: name} }

// idPath joins parts beneath dir. Each ID must pass structs.ValidateID,
// which makes it one plain path component; the error names the first that
// does not and wraps structs.ErrInvalidRequest.
func idPath(dir string, parts ...pathPart) (string, error) {
	elems := make([]string, 0, len(parts)+1)
	elems = append(elems, dir)
	for _, p := range parts {
		if p.kind != "" {
			if err := structs.ValidateID(p.kind, p.name); err != nil {
				return "", err
			}
		} else if !filepath.IsLocal(p.name) {
			panic(fmt.Sprintf("client layout name %q is not local", p.name))
		}
		elems = append(elems, p.name)
	}
	return filepath.Join(elems...), nil
}

// openRootDir opens dir as an os.Root, creating it (and its parents, which
// come from the client's own configuration) with perm first if need be.
func openRootDir(dir string, perm os.FileMode) (*os.Root, error) {
	if err := os.MkdirAll(dir, perm); err != nil {
		return nil, err
	}
	return os.OpenRoot(dir)
}

// relUnder is path relative to dir, refused unless it stays beneath dir
// by its names alone.
func relUnder(dir, path string) (string, error) {
	rel, err := filepath.Rel(dir, path)
	if err != nil || !filepath.IsLocal(rel) {
		return "", fmt.Errorf("%w: path %q is not beneath %q", structs.ErrInvalidRequest, path, dir)
	}
	return rel, nil
}

// mkdirAllIn creates path and its missing parents beneath dir, through an
// os.Root on dir: it fails rather than create anything outside dir.
func mkdirAllIn(dir, path string, perm os.FileMode) error {
	rel, err := relUnder(dir, path)
	if err != nil {
		return err
	}
	root, err := openRootDir(dir, perm)
	if err != nil {
		return err
	}
	defer root.Close()
	return root.MkdirAll(rel, perm)
}

// removeAllIn removes path and everything beneath it, through an os.Root
// on dir: nothing outside dir is removed, even through a symbolic link.
// A dir that does not exist has nothing to remove.
func removeAllIn(dir, path string) error {
	rel, err := relUnder(dir, path)
	if err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer root.Close()
	return root.RemoveAll(rel)
}
