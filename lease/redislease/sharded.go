package redislease

// Sharded pub/sub for release notices (Redis 7.0+). The hub subscribes with
// SSUBSCRIBE where the server has SPUBLISH (unless Options.ClassicPubSub),
// and release.lua publishes with SPUBLISH, falling back to PUBLISH on a
// server without it, so that each side follows the server it talks to. See
// hub.go.

// slotOf returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of its
// hash tag (the part between the first '{' and the next '}', if not empty)
// or of the whole key, modulo 16384, as Redis computes it (cluster
// specification, "Keys distribution model").
func slotOf(key string) int {
	for i := 0; i < len(key); i++ {
		if key[i] != '{' {
			continue
		}
		for j := i + 1; j < len(key); j++ {
			if key[j] == '}' {
				if j > i+1 {
					key = key[i+1 : j]
				}
				return int(crc16(key) % 16384)
			}
		}
		break
	}
	return int(crc16(key) % 16384)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the checksum
// Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
