package nomad

import (
	"fmt"

	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// A registration of an ID that is already registered is an update, held
// to the rules of structs.CheckCSIVolumeUpdate: checked here, before the
// leader proposes it, so that a refusal costs no Raft entry, and again by
// the state store when the entry is applied, so that a registration or a
// claim that raced past this check cannot slip through.

// checkVolumeUpdate checks v, a volume about to be proposed for
// registration, against the registration of its ID: nil when the ID is
// free or the update is allowed.
func checkVolumeUpdate(store *state.StateStore, v *structs.CSIVolume) error {
	old, err := store.CSIVolumeByID(nil, v.Namespace, v.ID)
	if err != nil {
		return err
	}
	if old == nil {
		return nil
	}
	next := v.Copy()
	next.InheritUnset(old)
	return structs.CheckCSIVolumeUpdate(old, next)
}

// createAsUpdate turns a create of old's ID into an update of old's
// registration, as Nomad does: no provider volume is created, so the
// external ID is the registered one (a create spec has none; one that
// names another is refused by the update check) and so is the context,
// which the provider answered with when it made the volume; the caller's
// context only fills in keys the registration lacks, as on a first create.
func createAsUpdate(old, v *structs.CSIVolume) *structs.CSIVolume {
	next := v.Copy()
	if next.Namespace == "" {
		next.Namespace = structs.DefaultNamespace
	}
	if next.Name == "" {
		next.Name = next.ID
	}
	next.Claims = nil
	if next.ExternalID == "" {
		next.ExternalID = old.ExternalID
	}
	if len(old.Context) > 0 || len(v.Context) > 0 {
		ctx := make(map[string]string, len(old.Context)+len(v.Context))
		for k, val := range v.Context {
			ctx[k] = val
		}
		for k, val := range old.Context {
			ctx[k] = val
		}
		next.Context = ctx
	}
	return next
}

// registerVolume registers one volume through Raft and returns it as
// stored, with the index of the write.
func (s *Server) registerVolume(vol *structs.CSIVolume, wr structs.WriteRequest) (*structs.CSIVolume, uint64, error) {
	req := structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{vol}, WriteRequest: wr}
	_, index, err := s.raftApply(structs.CSIVolumeRegisterRequestType, &req)
	if err != nil {
		return nil, 0, err
	}
	latest, err := s.State().CSIVolumeByID(nil, structs.DefaultNamespace, vol.ID)
	if err != nil {
		return nil, 0, err
	}
	if latest == nil {
		return nil, 0, fmt.Errorf("volume %q vanished after its registration", vol.ID)
	}
	return latest, index, nil
}
