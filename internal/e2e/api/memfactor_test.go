//go:build !race

package api

// memFactor scales the bounds of the tests that measure the api process's
// resident memory (memfactor_race_test.go): 1 without the race detector.
const memFactor = 1
