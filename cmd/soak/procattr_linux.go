package main

import "syscall"

// procAttr makes a child die with the soak, however the soak ends.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
