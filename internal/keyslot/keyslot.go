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

// Same reports whether keys a and b are in one hash slot: at once when
// they have the same hash tag (the keys of one namespace), else by their
// slots.
func Same(a, b string) bool {
	if ta, ok := Tag(a); ok {
		if tb, ok := Tag(b); ok && ta == tb {
			return true
		}
	}
	return Of(a) == Of(b)
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

// crc16 is CRC16-XMODEM (polynomial 0x1021, initial value 0), a byte at a
// time from crcTable.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^s[i]]
	}
	return crc
}

// crcTable holds the CRC16-XMODEM of every byte value.
var crcTable = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
