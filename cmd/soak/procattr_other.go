//go:build !linux

package main

import "syscall"

// procAttr: without Pdeathsig, the soak's cleanup alone stops its children.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{}
}
