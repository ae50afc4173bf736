package wharfwebhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
)

// decodeSecret returns the key of a Standard Webhooks secret. Its errors
// never show the secret.
func decodeSecret(secret string) ([]byte, error) {
	s := strings.TrimPrefix(strings.TrimSpace(secret), secretPrefix)
	key, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, errors.New("is not a Standard Webhooks secret: want whsec_ followed by base64")
	}
	if len(key) == 0 {
		return nil, errors.New("is an empty Standard Webhooks secret: want whsec_ followed by base64")
	}
	return key, nil
}

// sign returns the webhook-signature value of a request: "v1," and the
// base64 HMAC-SHA256, keyed with key, of "<id>.<timestamp>.<body>".
func sign(key []byte, id, timestamp string, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write([]byte(timestamp))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}
