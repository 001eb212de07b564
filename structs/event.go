package structs

import "errors"

// Event stream topics, as Nomad names them.
const (
	TopicNode       = "Node"
	TopicJob        = "Job"
	TopicAllocation = "Allocation"
	TopicEvaluation = "Evaluation"
	TopicCSIVolume  = "CSIVolume"
	TopicCSIPlugin  = "CSIPlugin"
	// TopicAll in a subscription matches every topic.
	TopicAll = "*"
)

// EventTopics are the topics a subscription may name.
var EventTopics = []string{TopicNode, TopicJob, TopicAllocation, TopicEvaluation, TopicCSIVolume, TopicCSIPlugin}

// Event is one change to one object, at the Raft index that made it. The
// payload is the object after the change (before it, for a deletion),
// with its secrets removed: a *Node, *Job, *Allocation, *Evaluation,
// *CSIVolume or *CSIPlugin.
type Event struct {
	Topic     string
	Type      string
	Key       string
	Namespace string
	// FilterKeys are more keys a subscription may match the event by (an
	// allocation's job ID, a volume's plugin ID).
	FilterKeys []string
	Index      uint64
	Payload    any
}

// EventBatch is every event of one Raft index.
type EventBatch struct {
	Index  uint64
	Events []Event
}

// ErrEventsDropped means events a subscriber asked for, or had not yet
// read, are no longer in the server's event buffer: continuing would
// leave a gap. The subscriber re-reads the state it needs and subscribes
// again from the present.
var ErrEventsDropped = errors.New("events dropped from the buffer")
