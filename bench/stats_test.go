package bench

import (
	"testing"
	"time"
)

func TestParseInfo(t *testing.T) {
	info := "# Stats\r\ntotal_connections_received:3\r\ntotal_commands_processed:120\r\n\r\n" +
		"# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:0.250000\r\n\r\n" +
		"# Commandstats\r\ncmdstat_evalsha:calls=40,usec=160,usec_per_call=4.00,rejected_calls=0,failed_calls=1\r\n" +
		"cmdstat_hget:calls=40,usec=8,usec_per_call=0.20,rejected_calls=0,failed_calls=0\r\n"
	st, err := ParseInfo(info)
	if err != nil {
		t.Fatal(err)
	}
	if st.Commands != 120 || st.CPU != 1750*time.Millisecond || st.Calls["evalsha"] != 40 || st.Usec["evalsha"] != 160 || st.Calls["hget"] != 40 {
		t.Errorf("ParseInfo = %+v", st)
	}
	before := ServerStats{Commands: 20, CPU: time.Second, Calls: map[string]int64{"evalsha": 10}, Usec: map[string]int64{"evalsha": 60}}
	d := st.Sub(before)
	if d.Commands != 100 || d.CPU != 750*time.Millisecond || d.Calls["evalsha"] != 30 || d.Usec["evalsha"] != 100 || d.Calls["hget"] != 40 {
		t.Errorf("Sub = %+v", d)
	}
	if _, err := ParseInfo("# Stats\r\n"); err == nil {
		t.Error("ParseInfo of an empty INFO: no error")
	}
}
