// Pushes bodies with Go's net/http, as a client that talks to weir directly would, and
// reports what it saw: the Go twin of tests/python/refusal_client.py.
//
//	go run refusal_client.go HOST PORT TENANT BODY_BYTES COUNT
//
// Sends COUNT pushes of BODY_BYTES random bytes on one client (its keep-alive pool), each
// body streamed in 32 KiB pieces 2 ms apart so the answer can come while it is still on its
// way, and prints one JSON line: the statuses seen, how many carried Retry-After, the errors,
// how many connections were opened, and how many answers asked to close the connection.
//
// Go's Transport itself drops a connection whose request body is still being written 50 ms
// after the answer was read (maxWriteWaitBeforeConnReuse), so with bodies that take longer
// to send it opens a connection per push whatever the server does; `server_close` shows the
// server's side.
package main

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"strconv"
	"time"
)

// slowBody hands out its bytes 32 KiB at a time, 2 ms apart, as over a real network.
type slowBody struct {
	data []byte
	sent int
}

func (b *slowBody) Read(p []byte) (int, error) {
	if b.sent >= len(b.data) {
		return 0, io.EOF
	}
	if b.sent > 0 {
		time.Sleep(2 * time.Millisecond)
	}
	n := copy(p[:min(len(p), 32<<10)], b.data[b.sent:])
	b.sent += n
	return n, nil
}

func main() {
	host, port, tenant := os.Args[1], os.Args[2], os.Args[3]
	size, _ := strconv.Atoi(os.Args[4])
	count, _ := strconv.Atoi(os.Args[5])
	body := make([]byte, size)
	if _, err := rand.Read(body); err != nil {
		panic(err)
	}
	url := fmt.Sprintf("http://%s:%s/api/v1/push", host, port)
	client := &http.Client{Timeout: 30 * time.Second}
	statuses, errors := []int{}, []string{}
	retryAfter, connections, serverClose := 0, 0, 0
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if !info.Reused {
			connections++
		}
	}}
	for i := 0; i < count; i++ {
		request, err := http.NewRequest("POST", url, &slowBody{data: body})
		if err != nil {
			panic(err)
		}
		request.ContentLength = int64(size)
		request.Header.Set("X-Scope-OrgID", tenant)
		request.Header.Set("Content-Encoding", "snappy")
		request.Header.Set("Content-Type", "application/x-protobuf")
		request.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
		request = request.WithContext(httptrace.WithClientTrace(request.Context(), trace))
		response, err := client.Do(request)
		if err != nil {
			errors = append(errors, err.Error())
			continue
		}
		io.Copy(io.Discard, response.Body)
		response.Body.Close()
		statuses = append(statuses, response.StatusCode)
		if response.Close {
			serverClose++
		}
		if response.Header.Get("Retry-After") != "" {
			retryAfter++
		}
	}
	out, _ := json.Marshal(map[string]any{
		"statuses": statuses, "retry_after": retryAfter, "errors": errors,
		"connections": connections, "server_close": serverClose,
	})
	fmt.Println(string(out))
}
