package inventory

import (
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/datum-cloud/galactic-node/node/identity"
)

// attachmentDoc is one VPCAttachment document with its fields written
// verbatim, quoted or not, as a hand-written inventory file has them.
func attachmentDoc(apiVersion, kind, name, namespace, vpc, attachment string) string {
	return "apiVersion: " + apiVersion + "\nkind: " + kind +
		"\nmetadata:\n  name: " + name + "\n  namespace: " + namespace +
		"\nstatus:\n  vpc: " + vpc + "\n  vpcAttachment: " + attachment + "\n"
}

func parseOne(t *testing.T, doc string) Object {
	t.Helper()
	objs, err := ParseObjects([]byte(doc))
	if err != nil {
		t.Fatalf("ParseObjects:\n%s\n= %v", doc, err)
	}
	if len(objs) != 1 {
		t.Fatalf("ParseObjects:\n%s\n= %d objects, want 1", doc, len(objs))
	}
	return objs[0]
}

// The CRDs keep these fields as strings, so the file must read them as the
// text written: YAML 1.1 would read 0012 and 010 as octal, 0x1A as hex, 1.0
// as a float and true as a bool, and the identity carried would be another
// one, or none, than the one the cluster carries.
func TestIdentifiersAreReadAsTheTextWritten(t *testing.T) {
	for _, text := range []string{"0012", "010", "0x1A", "1.0", "true", "n", "off", "1e3", "0o17", "12", "zz"} {
		for _, quoted := range []bool{false, true} {
			written := text
			if quoted {
				written = strconv.Quote(text)
			}
			for field, tc := range map[string]struct{ doc, vpc, att, name, ns string }{
				"status.vpc":           {attachmentDoc(AttachmentAPIVersion, AttachmentKind, "web-0", "tenant-a", written, "1"), text, "1", "web-0", "tenant-a"},
				"status.vpcAttachment": {attachmentDoc(AttachmentAPIVersion, AttachmentKind, "web-0", "tenant-a", "1", written), "1", text, "web-0", "tenant-a"},
				"metadata":             {attachmentDoc(AttachmentAPIVersion, AttachmentKind, written, written, "1", "1"), "1", "1", text, text},
			} {
				got := parseOne(t, tc.doc)
				if want := AttachmentObject(tc.ns, tc.name, tc.vpc, tc.att); !reflect.DeepEqual(got, want) {
					t.Errorf("%s written %s: got %+v, want %+v (as the text %q reads)", field, written, got, want, text)
				}
			}
		}
	}
	// The case that removed a live tap: attachment 0012 is base62 12.
	got := parseOne(t, attachmentDoc(AttachmentAPIVersion, AttachmentKind, "web-0", "tenant-a", "1", "0012"))
	if want := []identity.Identity{{VPC: 1, Attachment: 1*62 + 2}}; !reflect.DeepEqual(got.Identities, want) {
		t.Errorf("vpcAttachment: 0012 carries %v, want %v", got.Identities, want)
	}
	// kind and apiVersion too: an error names what was written.
	_, err := ParseObjects([]byte(attachmentDoc("1.0", "0x1A", "web-0", "tenant-a", "1", "1")))
	if err == nil || !strings.Contains(err.Error(), "(1.0 0x1A tenant-a/web-0)") {
		t.Errorf("apiVersion 1.0, kind 0x1A: err = %v, want it to name them as written", err)
	}
}

// An explicit null or an empty value is "not set", as the API server would
// drop it; a quoted "null" or "~" is text, and malformed as an identifier.
func TestNullAndEmptyIdentifiersAreNotSet(t *testing.T) {
	for _, v := range []string{"~", "null", "Null", "NULL", "", `""`, "''"} {
		got := parseOne(t, attachmentDoc(AttachmentAPIVersion, AttachmentKind, "web-0", "tenant-a", "1", v))
		if want := AttachmentObject("tenant-a", "web-0", "1", ""); !reflect.DeepEqual(got, want) {
			t.Errorf("vpcAttachment: %s: got %+v, want %+v (carries none yet)", v, got, want)
		}
		got = parseOne(t, attachmentDoc(AttachmentAPIVersion, AttachmentKind, "web-0", v, "1", "1"))
		if got.Ref.Namespace != "" {
			t.Errorf("namespace: %s: read as %q, want not set", v, got.Ref.Namespace)
		}
	}
	for _, v := range []string{`"~"`, `"null"`, `'null'`} {
		if got := parseOne(t, attachmentDoc(AttachmentAPIVersion, AttachmentKind, "web-0", "tenant-a", "1", v)); !got.Malformed {
			t.Errorf("vpcAttachment: %s: got %+v, want malformed", v, got)
		}
	}
	for _, doc := range []string{
		attachmentDoc(AttachmentAPIVersion, AttachmentKind, "~", "ns", "1", "1"),
		attachmentDoc(AttachmentAPIVersion, AttachmentKind, "null", "ns", "1", "1"),
		"apiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: ~\n",
	} {
		if _, err := ParseObjects([]byte(doc)); err == nil || !strings.Contains(err.Error(), "metadata.name is empty") {
			t.Errorf("%s: err = %v, want metadata.name is empty", doc, err)
		}
	}
	got := parseOne(t, "apiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: {name: web-0}\nstatus: ~\n")
	if got.Malformed || len(got.Identities) != 0 {
		t.Errorf("status: ~: got %+v, want an attachment that carries none yet", got)
	}
}

// A value that is not a scalar where a string is expected is an error naming
// the document, never an identifier read as empty.
func TestANonScalarIdentifierIsAnErrorNamingTheDocument(t *testing.T) {
	for _, tc := range []struct{ field, value string }{
		{"status.vpc", "{a: b}"},
		{"status.vpcAttachment", "[1]"},
		{"metadata.name", "{a: b}"},
		{"metadata.namespace", "[x]"},
		{"kind", "[VPCAttachment]"},
		{"apiVersion", "{a: b}"},
	} {
		fields := map[string]string{"apiVersion": AttachmentAPIVersion, "kind": AttachmentKind, "metadata.name": "web-0", "metadata.namespace": "tenant-a", "status.vpc": "1", "status.vpcAttachment": "1"}
		fields[tc.field] = tc.value
		doc := goodInventory + "---\n" + attachmentDoc(fields["apiVersion"], fields["kind"], fields["metadata.name"], fields["metadata.namespace"], fields["status.vpc"], fields["status.vpcAttachment"])
		_, err := ParseObjects([]byte(doc))
		if err == nil || !strings.Contains(err.Error(), "document 5") || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %s: err = %v, want an error naming document 5 and %s", tc.field, tc.value, err, tc.field)
		}
	}
}

// A key given twice, or a merge key that may set an identifier, reads one
// way or another depending on the YAML library: an error, not a guess.
// Aliases are followed, as every reader does.
func TestAmbiguousDocumentsAreErrorsAndAliasesAreFollowed(t *testing.T) {
	const head = "apiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nids: &ids {vpc: '1', vpcAttachment: '2'}\nmetadata: {name: web-0}\n"
	for doc, want := range map[string]string{
		head + "status: {vpc: '1', vpcAttachment: '2', vpcAttachment: '3'}\n": "document 1: status.vpcAttachment: key given twice",
		head + "status: {<<: *ids}\n":                                         "document 1: status.vpc: a merge key (<<) may set it",
	} {
		if _, err := ParseObjects([]byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", doc, err, want)
		}
	}
	got := parseOne(t, head+"status: *ids\n")
	if want := AttachmentObject("", "web-0", "1", "2"); !reflect.DeepEqual(got, want) {
		t.Errorf("status: *ids: got %+v, want %+v", got, want)
	}
}
