package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ServerStats is what a Redis server says about its own work, from INFO.
type ServerStats struct {
	// Commands is total_commands_processed: every command the server ran,
	// those that Lua scripts call included (Redis 7), so a renew script
	// counts 3 (EVALSHA, HGET, PEXPIRE).
	Commands int64
	// Calls is the number of calls per command (INFO commandstats), by
	// lower-case command name: "evalsha", and also "hget", "pexpire", ...
	// for the commands that scripts call.
	Calls map[string]int64
	// Usec is the time spent executing each command (INFO commandstats),
	// in microseconds, by the same names. A script's time includes the
	// commands it calls, which are counted under their own names too.
	Usec map[string]int64
	// CPU is the server's user plus system CPU time (used_cpu_user +
	// used_cpu_sys).
	CPU time.Duration
}

// ReadServerStats reads INFO stats, cpu and commandstats from c.
func ReadServerStats(ctx context.Context, c redis.Cmdable) (ServerStats, error) {
	s, err := c.Info(ctx, "stats", "cpu", "commandstats").Result()
	if err != nil {
		return ServerStats{}, fmt.Errorf("bench: INFO: %w", err)
	}
	return ParseInfo(s)
}

// ParseInfo parses the text of INFO stats, cpu and commandstats.
func ParseInfo(info string) (ServerStats, error) {
	st := ServerStats{Calls: make(map[string]int64), Usec: make(map[string]int64)}
	var seen int
	for line := range strings.Lines(info) {
		line = strings.TrimSpace(line)
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		switch {
		case k == "total_commands_processed":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return st, fmt.Errorf("bench: INFO %s: %w", line, err)
			}
			st.Commands = n
			seen++
		case k == "used_cpu_user" || k == "used_cpu_sys":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return st, fmt.Errorf("bench: INFO %s: %w", line, err)
			}
			st.CPU += time.Duration(f * float64(time.Second))
			seen++
		case strings.HasPrefix(k, "cmdstat_"):
			// cmdstat_evalsha:calls=12,usec=34,...
			name := strings.TrimPrefix(k, "cmdstat_")
			for field := range strings.SplitSeq(v, ",") {
				f, val, _ := strings.Cut(field, "=")
				var m map[string]int64
				switch f {
				case "calls":
					m = st.Calls
				case "usec":
					m = st.Usec
				default:
					continue
				}
				n, err := strconv.ParseInt(val, 10, 64)
				if err != nil {
					return st, fmt.Errorf("bench: INFO %s: %w", line, err)
				}
				m[name] = n
			}
		}
	}
	if seen < 3 {
		return st, fmt.Errorf("bench: INFO lacks total_commands_processed, used_cpu_user or used_cpu_sys")
	}
	return st, nil
}

// Sub returns the difference s - before, command by command.
func (s ServerStats) Sub(before ServerStats) ServerStats {
	d := ServerStats{
		Commands: s.Commands - before.Commands, CPU: s.CPU - before.CPU,
		Calls: make(map[string]int64), Usec: make(map[string]int64),
	}
	for k, v := range s.Calls {
		if n := v - before.Calls[k]; n != 0 {
			d.Calls[k] = n
		}
	}
	for k, v := range s.Usec {
		if n := v - before.Usec[k]; n != 0 {
			d.Usec[k] = n
		}
	}
	return d
}
