// Package keyslot computes Redis Cluster hash slots, so that configuration
// can be checked for keys that would not share a slot before any command
// fails with CROSSSLOT.
package keyslot

import "strings"

// Slots is the number of Redis Cluster hash slots.
const Slots = 16384

// Of returns the hash slot of key: CRC16 (XMODEM) of the key's hash tag, or
// of the whole key when it has none, modulo 16384.
func Of(key string) int {
	if tag, ok := Tag(key); ok {
		key = tag
	}
	return int(crc16(key)) % Slots
}

// Tag returns key's hash tag, the text between its first '{' and the first
// '}' after it, and whether key has one (a tag is never empty: in
// "a{}{b}" Redis hashes the whole key).
func Tag(key string) (string, bool) {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			return key[s+1 : s+1+e], true
		}
	}
	return "", false
}

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
