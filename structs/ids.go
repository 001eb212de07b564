package structs

import (
	"fmt"
	"unicode/utf8"
)

// MaxIDBytes bounds every identifier and name that ValidateID or
// ValidateExternalID accept. It is also the CSI spec's bound on the IDs and
// names a CO sends a plugin.
const MaxIDBytes = 128

// Kinds of identifier, as ValidateID's errors name them.
const (
	IDKindVolume      = "volume ID"
	IDKindACLPolicy   = "acl policy name"
	IDKindACLToken    = "acl token accessor ID"
	IDKindPlugin      = "plugin ID"
	IDKindJob         = "job ID"
	IDKindGroup       = "task group name"
	IDKindTask        = "task name"
	IDKindNode        = "node ID"
	IDKindNodeName    = "node name"
	IDKindAlloc       = "allocation ID"
	IDKindEval        = "evaluation ID"
	IDKindVolumeSrc   = "volume source"
	IDKindExternalVol = "external volume ID"
	IDKindSnapshot    = "snapshot ID"
	IDKindSnapshotNm  = "snapshot name"
)

// InvalidIDError is the error ValidateID and ValidateExternalID return: it
// names the kind of identifier and quotes the ID (with %q, so control
// characters show; cut short past MaxIDBytes), and matches
// ErrInvalidRequest under errors.Is.
type InvalidIDError struct {
	Kind   string
	ID     string
	Reason string
}

func (e *InvalidIDError) Error() string {
	return e.Kind + " " + quoteID(e.ID) + " " + e.Reason
}

// Unwrap makes an invalid ID an invalid request.
func (e *InvalidIDError) Unwrap() error { return ErrInvalidRequest }

// ValidateID checks an identifier or name of Roam's own that may become a
// file name: on a client (volume, plugin, allocation and task directories,
// plugin sockets), or at a plugin. One rule for every kind, so that
// whatever a server accepts is safe as a single path component anywhere:
//
//   - 1 to MaxIDBytes bytes;
//   - only ASCII letters, digits, '_', '-', '.', '[' and ']' (brackets for
//     per-allocation volume IDs such as "data[2]");
//   - starting with a letter or a digit, so never "." or "..", never a
//     hidden file and never something a command line takes for a flag.
//
// No slash, backslash, NUL, control character, space or non-ASCII byte can
// pass. kind names the identifier in the error (IDKindVolume, …). A
// failure is an *InvalidIDError, which wraps ErrInvalidRequest.
func ValidateID(kind, id string) error {
	if why := idProblem(id); why != "" {
		return &InvalidIDError{Kind: kind, ID: id, Reason: why}
	}
	return nil
}

// ValidateExternalID checks an identifier that belongs to a storage
// provider: an external volume ID, a snapshot ID, a name Roam passes on to
// a plugin. Roam never builds a path from one, and providers use their own
// forms (a cloud's IDs hold '/' and ':'), so only what no provider needs is
// refused: an empty ID, one over MaxIDBytes bytes (the CSI spec's limit),
// invalid UTF-8, and control characters (NUL among them). A failure is an
// *InvalidIDError.
func ValidateExternalID(kind, id string) error {
	if why := externalIDProblem(id); why != "" {
		return &InvalidIDError{Kind: kind, ID: id, Reason: why}
	}
	return nil
}

// idProblem says what is wrong with id under ValidateID's rule; "" when
// nothing is.
func idProblem(id string) string {
	switch {
	case id == "":
		return "is empty"
	case len(id) > MaxIDBytes:
		return fmt.Sprintf("is %d bytes; at most %d bytes are allowed", len(id), MaxIDBytes)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if isIDLetterOrDigit(c) {
			continue
		}
		if i == 0 {
			return "must start with a letter or a digit"
		}
		switch c {
		case '_', '-', '.', '[', ']':
			continue
		}
		return fmt.Sprintf("holds %s at byte %d; only letters, digits, '_', '-', '.', '[' and ']' are allowed", describeByte(c), i)
	}
	return ""
}

// externalIDProblem says what is wrong with id under ValidateExternalID's
// rule; "" when nothing is.
func externalIDProblem(id string) string {
	switch {
	case id == "":
		return "is empty"
	case len(id) > MaxIDBytes:
		return fmt.Sprintf("is %d bytes; at most %d bytes are allowed", len(id), MaxIDBytes)
	case !utf8.ValidString(id):
		return "is not valid UTF-8"
	}
	for i, r := range id {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return fmt.Sprintf("holds the control character %U at byte %d", r, i)
		}
	}
	return ""
}

func isIDLetterOrDigit(c byte) bool {
	return ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9')
}

// describeByte names a byte for an error message.
func describeByte(c byte) string {
	switch {
	case c == 0:
		return "a NUL"
	case c < 0x20 || c == 0x7f:
		return fmt.Sprintf("the control character %q", c)
	case c >= 0x80:
		return "a non-ASCII byte"
	}
	return fmt.Sprintf("%q", c)
}

// quoteID quotes an ID for an error, cut short when it is far over the
// limit: an error must not echo a megabyte back.
func quoteID(id string) string {
	if len(id) <= 2*MaxIDBytes {
		return fmt.Sprintf("%q", id)
	}
	return fmt.Sprintf("%q…", id[:MaxIDBytes/2])
}
