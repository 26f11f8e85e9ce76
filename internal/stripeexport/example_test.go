package stripeexport_test

import (
	"fmt"

	"github.com/tollgate/tollgate/internal/stripeexport"
)

// The idempotency keys of an export, the same on every attempt.
func ExampleLineKey() {
	const tenant, invoice = "5f3c2a9e-0000-4000-8000-000000000001", "9b1d7c44-0000-4000-8000-000000000002"
	fmt.Println(stripeexport.CustomerKey(tenant))
	fmt.Println(stripeexport.InvoiceKey(invoice, "create"))
	fmt.Println(stripeexport.LineKey(invoice, 1))
	fmt.Println(stripeexport.InvoiceKey(invoice, "finalize"))
	// Output:
	// tollgate-cust-5f3c2a9e-0000-4000-8000-000000000001
	// tollgate-inv-9b1d7c44-0000-4000-8000-000000000002-create
	// tollgate-inv-9b1d7c44-0000-4000-8000-000000000002-line-1
	// tollgate-inv-9b1d7c44-0000-4000-8000-000000000002-finalize
}
