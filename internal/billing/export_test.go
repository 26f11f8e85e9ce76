package billing

import "net/netip"

// SetDialAllowed replaces d's check of the addresses it dials, so that tests
// whose receivers all listen on loopback can tell an allowed one from a
// refused one.
func SetDialAllowed(d *Deliverer, allowed func(netip.AddrPort) bool) { d.dialAllowed = allowed }
