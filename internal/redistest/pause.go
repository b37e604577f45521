package redistest

import "syscall"

// Pause freezes the server process with SIGSTOP: it keeps its connections
// open and answers nothing, like a host that stalls. Resume undoes it, and
// so does the test's end (a stopped process cannot be killed cleanly).
func (s *Server) Pause() {
	s.t.Helper()
	if s.cmd == nil {
		s.t.Fatal("redistest: Pause of a stopped server")
	}
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatalf("redistest: SIGSTOP: %v", err)
	}
	s.t.Cleanup(s.Resume)
}

// Resume continues a server frozen by Pause.
func (s *Server) Resume() {
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
	}
}
