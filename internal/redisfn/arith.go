package redisfn

// FloorDiv is integer division rounding toward minus infinity (Go's /
// truncates toward zero), as the scripts' idiv; b > 0.
func FloorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
