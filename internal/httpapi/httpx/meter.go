package httpx

// ValidMeter reports whether m is a meter name: 1 to 64 of a-z 0-9 _ . -,
// the first a letter or digit.
func ValidMeter(m string) bool {
	if len(m) < 1 || len(m) > 64 {
		return false
	}
	for i := 0; i < len(m); i++ {
		b := m[i]
		if !(b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || (i > 0 && (b == '_' || b == '.' || b == '-'))) {
			return false
		}
	}
	return true
}
