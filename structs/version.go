package structs

// Version is the Roam release every agent reports.
const Version = "0.3.0"
