//go:build race

package api

// memFactor scales the bounds of the tests that measure the api process's
// resident memory: under the race detector, its shadow memory multiplies
// what every goroutine and heap byte costs.
const memFactor = 5
