package nomad

// registerEndpoints registers every RPC service. Each service's methods
// have the net/rpc shape and nothing else is exported on them.
func (s *Server) registerEndpoints() {
	for name, svc := range map[string]any{
		"Status":    &Status{srv: s},
		"ClientRPC": &ClientRPC{srv: s},
		"Node":      &Node{srv: s},
		"Operator":  &Operator{srv: s},
		"Job":       &Job{srv: s},
		"Alloc":     &Alloc{srv: s},
		"Eval":      &Eval{srv: s},
		"CSIVolume": &CSIVolume{srv: s},
		"CSIPlugin": &CSIPlugin{srv: s},
		"ACL":       &ACL{srv: s},
		"Agent":     &Agent{srv: s},
	} {
		if err := s.rpcServer.RegisterName(name, svc); err != nil {
			panic("nomad: register " + name + " endpoint: " + err.Error())
		}
	}
}
