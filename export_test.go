package wharf

// The engine checks its bookkeeping after every event in this package's tests.
func init() { checkInvariants = true }
