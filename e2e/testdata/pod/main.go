// Command pod is the e2e node's pod image: with no argument it waits for a
// signal, as the runtime's sandbox ("pause") process does; with "serve" it
// answers every TCP connection on :8080 with its hostname, so that a test
// can see a pod's primary network carry traffic.
package main

import (
	"net"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		l, err := net.Listen("tcp", ":8080")
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		host, _ := os.Hostname()
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				_, _ = c.Write([]byte(host + "\n"))
				c.Close()
			}
		}()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
