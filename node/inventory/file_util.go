package inventory

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
)

// documentReader splits a YAML stream into documents at "---" lines, as
// apimachinery's YAMLReader does (kubectl reads a file so), without linking
// apimachinery: a line starting "---" ends a document (the one opening a
// document stays in it), and anything but spaces or a comment after it is
// an error. Every line of a document ends in "\n", "\r\n" becoming "\n".
type documentReader struct{ r *bufio.Reader }

func newDocumentReader(b []byte) *documentReader {
	return &documentReader{r: bufio.NewReader(bytes.NewReader(b))}
}

// Read returns the next document, or io.EOF after the last.
func (d *documentReader) Read() ([]byte, error) {
	const separator = "---"
	var doc bytes.Buffer
	for {
		line, err := d.line()
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		if rest, ok := bytes.CutPrefix(line, []byte(separator)); ok {
			if t := strings.TrimSpace(string(rest)); len(t) > 0 && t[0] != '#' {
				return nil, fmt.Errorf("invalid Yaml document separator: %s", t)
			}
			if doc.Len() != 0 {
				return doc.Bytes(), nil
			}
			if errors.Is(err, io.EOF) {
				return nil, err
			}
		}
		if errors.Is(err, io.EOF) {
			if doc.Len() != 0 {
				return doc.Bytes(), nil
			}
			return nil, err
		}
		doc.Write(line)
	}
}

// line returns one line, however long, ending in "\n"; its error is the
// reader's.
func (d *documentReader) line() ([]byte, error) {
	var b bytes.Buffer
	more, err := true, error(nil)
	for more && err == nil {
		var part []byte
		part, more, err = d.r.ReadLine()
		b.Write(part)
	}
	b.WriteByte('\n')
	return b.Bytes(), err
}

// stripComments drops whole-line YAML comments, so that a document holding
// only comments counts as empty.
func stripComments(b []byte) []byte {
	var out []byte
	for line := range bytes.Lines(b) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] == '#' {
			continue
		}
		out = append(out, line...)
	}
	return out
}

func inodeOf(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
