package httpx

// ValidMeter reports whether m is a meter name: 1 to 64 of a-z 0-9 _ . -,
// the first a letter or digit.
func ValidMeter(m string) bool {
	if len(m) < 1 || len(m) > 64 {
		return false
	}
	for i := 0; i < len(m); i++ {
		if !meterByte(m[i], i == 0) {
			return false
		}
	}
	return true
}

// meterByte reports whether b may stand in a meter name: a-z or 0-9
// anywhere, and _ . - but for the first byte.
func meterByte(b byte, first bool) bool {
	return b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || !first && (b == '_' || b == '.' || b == '-')
}
