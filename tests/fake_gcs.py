"""A fake Cloud Storage endpoint for the registry's artifact store, as MLflow's GCS artifact repository
(google-cloud-storage) and the cluster agent use it: an OAuth token endpoint for a service-account key,
the JSON API's object calls (list, get, media download, multipart and resumable uploads, delete), and the XML API's
multipart uploads with V4 signed part URLs. What Google refuses, it refuses, in Google's error shape:

- a JSON API call without a token it issued: 401 (https://cloud.google.com/storage/docs/json_api/v1/status-codes);
- a signed URL whose signature does not verify with the service account's key, or which has expired:
  403 SignatureDoesNotMatch / ExpiredToken (https://cloud.google.com/storage/docs/access-control/signed-urls,
  https://cloud.google.com/storage/docs/xml-api/reference-status);
- a completed multipart upload with a part other than the last under 5 MiB (EntityTooSmall), a part not
  uploaded or with another ETag (InvalidPart), more than 10,000 parts, a part over 5 GiB
  (https://cloud.google.com/storage/docs/multipart-uploads, https://cloud.google.com/storage/quotas).

    gcs = FakeGCS(); gcs.start(); gcs.key_file(path)   # a service-account JSON key whose token_uri is the fake
    ... API_ENDPOINT_OVERRIDE=gcs.url GOOGLE_APPLICATION_CREDENTIALS=path in the client's environment
    gcs.objects[("bucket", "name")] -> bytes; gcs.part_puts -> [(name, part number, bytes)]
    gcs.hold_parts = 3  # each part PUT waits (at most 5 s) until 3 are under way; gcs.most_parts_in_flight
"""

import base64
import binascii
import contextlib
import datetime
import hashlib
import json
import re
import secrets
import threading
import urllib.parse
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from xml.etree import ElementTree

import google_crc32c
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

CHUNK = 256 << 10
MIN_PART = 5 << 20
MAX_PART = 5 << 30
MAX_PARTS = 10_000
S3 = "http://s3.amazonaws.com/doc/2006-03-01/"
ACCOUNT = "mlflow-artifacts@tcc-tests.iam.gserviceaccount.com"


class Refused(Exception):
    def __init__(self, status, reason, message):
        super().__init__(message)
        self.status, self.reason = status, reason


class FakeGCS:
    def __init__(self):
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.tokens = set()
        self.objects = {}  # (bucket, name) -> bytes
        self.sessions = {}  # resumable upload id -> {"bucket", "name", "data"}
        self.uploads = {}  # upload id -> {"bucket", "name", "parts": {number: (etag, bytes)}}
        self.part_puts = []  # (object name, part number, size) of each accepted part PUT
        self.lock = threading.Lock()
        # Part PUTs under way at once, the most seen, and (a test's) how many each waits for (at most 5 s).
        self.parts_in_flight = self.most_parts_in_flight = self.hold_parts = 0
        self.flight = threading.Condition()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler(), bind_and_activate=False)
        self.server.daemon_threads, self.server.request_queue_size = True, 1024  # parts at once: no SYN dropped
        self.server.server_bind()
        self.server.server_activate()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def key_file(self, path):
        """Write a service-account JSON key (the account's private key, token_uri at the fake) to `path`."""
        pem = self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()).decode()  # fmt: skip
        path.write_text(json.dumps({
            "type": "service_account", "project_id": "tcc-tests", "private_key_id": "fake",
            "private_key": pem, "client_email": ACCOUNT, "client_id": "1", "token_uri": f"{self.url}/token",
        }))  # fmt: skip
        path.chmod(0o600)
        return path

    # -- the calls --------------------------------------------------------------------------------------

    def token(self, form):
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" or not form.get("assertion"):
            raise Refused(400, "invalid_grant", "a JWT bearer assertion is required")
        claims = self.verified_jwt(form["assertion"])
        if claims.get("iss") != ACCOUNT:
            raise Refused(400, "invalid_grant", "Invalid JWT Signature.")
        token = f"ya29.fake-{secrets.token_hex(16)}"
        self.tokens.add(token)
        return {"access_token": token, "expires_in": 3600, "token_type": "Bearer"}

    def verified_jwt(self, assertion):
        try:
            header, claims, signature = assertion.split(".")
            self.key.public_key().verify(unb64(signature), f"{header}.{claims}".encode(), padding.PKCS1v15(),
                                         hashes.SHA256())  # fmt: skip
            return json.loads(unb64(claims))
        except (ValueError, InvalidSignature, binascii.Error):
            raise Refused(400, "invalid_grant", "Invalid JWT Signature.") from None

    def listing(self, bucket, query):
        prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
        items, prefixes = [], set()
        with self.lock:
            names = sorted(name for (b, name) in self.objects if b == bucket and name.startswith(prefix))
            for name in names:
                rest = name[len(prefix) :]
                if delimiter and delimiter in rest:
                    prefixes.add(prefix + rest.split(delimiter, 1)[0] + delimiter)
                else:
                    items.append(self.resource(bucket, name))
        return {"kind": "storage#objects", "items": items, "prefixes": sorted(prefixes)}

    def resource(self, bucket, name):
        data = self.objects[(bucket, name)]
        crc = base64.b64encode(google_crc32c.Checksum(data).digest()).decode()
        return {"kind": "storage#object", "bucket": bucket, "name": name, "size": str(len(data)),
                "generation": "1", "metageneration": "1", "crc32c": crc, "contentType": "application/octet-stream",
                "md5Hash": base64.b64encode(hashlib.md5(data).digest()).decode(),
                "id": f"{bucket}/{name}/1", "updated": "2026-12-07T00:00:00.000Z"}  # fmt: skip

    def stored(self, bucket, name):
        with self.lock:
            if (bucket, name) not in self.objects:
                raise Refused(404, "notFound", f"No such object: {bucket}/{name}")
            return self.objects[(bucket, name)]

    def put_object(self, bucket, name, data):
        with self.lock:
            self.objects[(bucket, name)] = data
            return self.resource(bucket, name)

    def multipart_related(self, headers, body):
        """(metadata, data) of a JSON API uploadType=multipart body (multipart/related)."""
        message = BytesParser(policy=HTTP).parsebytes(
            f"Content-Type: {headers.get('Content-Type', '')}\r\n\r\n".encode() + body
        )
        parts = list(message.iter_parts())
        if len(parts) != 2:
            raise Refused(400, "invalid", "a multipart upload has a metadata part and a media part")
        return json.loads(parts[0].get_content()), parts[1].get_payload(decode=True)

    def open_session(self, bucket, name):
        session = secrets.token_hex(12)
        with self.lock:
            self.sessions[session] = {"bucket": bucket, "name": name, "data": bytearray()}
        return session

    def resume(self, session, content_range, data):
        """(done, object resource or the Range header to answer 308 with) for one PUT of a resumable
        upload: chunks in order, each but the last a multiple of 256 KiB
        (https://cloud.google.com/storage/docs/performing-resumable-uploads#chunked-upload)."""
        match = re.fullmatch(r"bytes (?:(\d+)-(\d+)|\*)/(\d+|\*)", content_range.strip())
        with self.lock:
            upload = self.sessions.get(session)
            if upload is None:
                raise Refused(404, "notFound", "No such upload session")
            held = len(upload["data"])
            if match is None:
                raise Refused(400, "invalid", "Content-Range must be bytes FIRST-LAST/TOTAL or bytes */TOTAL")
            if match[1] is not None:
                if int(match[1]) != held or int(match[2]) - int(match[1]) + 1 != len(data):
                    raise Refused(400, "invalid", f"the session holds {held} bytes; the chunk must start there")
                if match[3] == "*" and len(data) % CHUNK:
                    raise Refused(400, "invalid", "a chunk other than the last must be a multiple of 256 KiB")
                upload["data"] += data
            total = None if match[3] == "*" else int(match[3])
            if total is not None and len(upload["data"]) == total:
                del self.sessions[session]
                self.objects[(upload["bucket"], upload["name"])] = bytes(upload["data"])
                return True, self.resource(upload["bucket"], upload["name"])
        return False, f"bytes=0-{len(upload['data']) - 1}" if upload["data"] else ""

    def initiate(self, bucket, name):
        upload = f"ABPnzm{secrets.token_hex(12)}"
        with self.lock:
            self.uploads[upload] = {"bucket": bucket, "name": name, "parts": {}}
        return xml("InitiateMultipartUploadResult", Bucket=bucket, Key=name, UploadId=upload)

    def upload_of(self, query, bucket, name):
        upload = self.uploads.get(query.get("uploadId", ""))
        if upload is None or (upload["bucket"], upload["name"]) != (bucket, name):
            raise Refused(404, "NoSuchUpload", "The requested upload was not found.")
        return upload

    @contextlib.contextmanager
    def in_flight(self):
        with self.flight:
            self.parts_in_flight += 1
            self.most_parts_in_flight = max(self.most_parts_in_flight, self.parts_in_flight)
            self.flight.notify_all()
            self.flight.wait_for(lambda: self.parts_in_flight >= self.hold_parts, timeout=5)
        try:
            yield
        finally:
            with self.flight:
                self.parts_in_flight -= 1

    def put_part(self, bucket, name, query, data):
        try:
            number = int(query.get("partNumber", ""))
        except ValueError:
            number = 0
        if not 1 <= number <= MAX_PARTS:
            raise Refused(400, "InvalidArgument", "Part number must be an integer between 1 and 10000, inclusive.")
        if len(data) > MAX_PART:
            raise Refused(400, "EntityTooLarge", "Your proposed upload exceeds the maximum allowed object size.")
        etag = f'"{hashlib.md5(data).hexdigest()}"'
        with self.lock:
            self.upload_of(query, bucket, name)["parts"][number] = (etag, data)
            self.part_puts.append((name, number, len(data)))
        return etag

    def complete(self, bucket, name, query, body):
        with self.lock:
            upload = self.upload_of(query, bucket, name)
            try:
                listed = [(int(part.findtext("PartNumber")), part.findtext("ETag"))
                          for part in ElementTree.fromstring(body).iter("Part")]  # fmt: skip
            except (ElementTree.ParseError, TypeError, ValueError):
                raise Refused(400, "MalformedXML", "The XML you provided was not well-formed.") from None
            if not listed or [n for n, _ in listed] != sorted({n for n, _ in listed}):
                raise Refused(400, "InvalidPartOrder", "The list of parts was not in ascending order.")
            data = []
            for index, (number, etag) in enumerate(listed):
                if number not in upload["parts"] or upload["parts"][number][0].strip('"') != (etag or "").strip('"'):
                    raise Refused(400, "InvalidPart", f"Part {number} was not uploaded, or its ETag differs.")
                part = upload["parts"][number][1]
                if index < len(listed) - 1 and len(part) < MIN_PART:
                    raise Refused(400, "EntityTooSmall", "Your proposed upload is smaller than the minimum size.")
                data.append(part)
            del self.uploads[query["uploadId"]]
            self.objects[(bucket, name)] = b"".join(data)
        return xml("CompleteMultipartUploadResult", Bucket=bucket, Key=name, ETag='"-"')

    def abort(self, bucket, name, query):
        with self.lock:
            self.upload_of(query, bucket, name)
            del self.uploads[query["uploadId"]]

    def check_signature(self, method, path, raw_query, host):
        """Refuse a V4 signed URL that was not signed by the account's key for this request, or has expired."""
        pairs = [pair.split("=", 1) for pair in raw_query.split("&") if pair]
        query = {urllib.parse.unquote(k): urllib.parse.unquote(v) for k, v in pairs}
        if query.get("X-Goog-Algorithm") != "GOOG4-RSA-SHA256":
            raise Refused(403, "AccessDenied", "Anonymous caller does not have storage.objects.create access.")
        stamp = query.get("X-Goog-Date", "")
        credential = query.get("X-Goog-Credential", "")
        try:
            signed = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
            expires = signed + datetime.timedelta(seconds=int(query.get("X-Goog-Expires", "")))
        except ValueError:
            raise Refused(400, "AuthorizationQueryParametersError", "X-Goog-Date or X-Goog-Expires is bad") from None
        if datetime.datetime.now(datetime.UTC) > expires:
            raise Refused(400, "ExpiredToken", "Invalid argument.")  # GCS's answer to an expired signed URL
        canonical_query = "&".join(f"{k}={v}" for k, v in sorted(pairs) if k != "X-Goog-Signature")
        headers = query.get("X-Goog-SignedHeaders", "")
        if headers != "host":
            raise Refused(403, "SignatureDoesNotMatch", "The fake signs with the host header only.")
        request = "\n".join([method, path, canonical_query, f"host:{host}\n", headers, "UNSIGNED-PAYLOAD"])
        scope = credential.split("/", 1)[1] if "/" in credential else ""
        to_sign = "\n".join(["GOOG4-RSA-SHA256", stamp, scope, hashlib.sha256(request.encode()).hexdigest()])
        try:
            if not credential.startswith(f"{ACCOUNT}/"):
                raise InvalidSignature
            self.key.public_key().verify(bytes.fromhex(query.get("X-Goog-Signature", "")), to_sign.encode(),
                                         padding.PKCS1v15(), hashes.SHA256())  # fmt: skip
        except (InvalidSignature, ValueError):
            raise Refused(403, "SignatureDoesNotMatch", "Access denied. The request signature we calculated "
                          "does not match the signature you provided.") from None  # fmt: skip
        return query

    # -- HTTP ---------------------------------------------------------------------------------------------

    def handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):
                pass

            def do_GET(self):
                self.serve()

            def do_POST(self):
                self.serve()

            def do_PUT(self):
                self.serve()

            def do_DELETE(self):
                self.serve()

            def serve(self):
                path, _, raw_query = self.path.partition("?")
                query = dict(urllib.parse.parse_qsl(raw_query, keep_blank_values=True))
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                json_api = path.startswith(("/storage/v1/", "/download/storage/v1/", "/upload/storage/v1/"))
                try:
                    if path == "/token":
                        return self.json(200, fake.token(dict(urllib.parse.parse_qsl(body.decode()))))
                    if json_api or "uploads" in query or ("uploadId" in query and "partNumber" not in query):
                        self.authorized()
                    if json_api:
                        return self.json_api(path, query, body)
                    return self.xml_api(path, raw_query, query, body)
                except Refused as refusal:
                    if json_api or path == "/token":
                        return self.json(refusal.status, {"error": {"code": refusal.status, "message": str(refusal),
                                         "errors": [{"message": str(refusal), "domain": "global",
                                                     "reason": refusal.reason}]}})  # fmt: skip
                    return self.send(refusal.status, xml("Error", Code=refusal.reason, Message=str(refusal)),
                                     "application/xml")  # fmt: skip

            def authorized(self):
                header = self.headers.get("Authorization", "")
                if not header.startswith("Bearer ") or header[7:] not in fake.tokens:
                    raise Refused(401, "required", "Anonymous caller does not have storage.objects.list access.")

            def json_api(self, path, query, body):
                match = re.fullmatch(r"/(?:download/|upload/)?storage/v1/b/([^/]+)/o(?:/(.+))?", path)
                if match is None:
                    raise Refused(404, "notFound", "Not Found")
                bucket, name = match[1], urllib.parse.unquote(match[2] or "")
                if self.command == "POST" and path.startswith("/upload/") and query.get("uploadType") == "resumable":
                    name = (json.loads(body) if body else {}).get("name") or query.get("name")
                    location = f"{fake.url}{path}?uploadType=resumable&upload_id={fake.open_session(bucket, name)}"
                    return self.send(200, b"", "application/json", {"Location": location})
                if self.command == "PUT" and path.startswith("/upload/") and "upload_id" in query:
                    done, answer = fake.resume(query["upload_id"], self.headers.get("Content-Range", ""), body)
                    if done:
                        return self.json(200, answer)
                    return self.send(308, b"", "text/plain", {"Range": answer} if answer else {})
                if self.command == "POST" and path.startswith("/upload/"):
                    if query.get("uploadType") != "multipart":
                        raise Refused(400, "invalid", "uploadType must be multipart or resumable")
                    metadata, data = fake.multipart_related(self.headers, body)
                    return self.json(200, fake.put_object(bucket, metadata.get("name") or query.get("name"), data))
                if self.command == "GET" and not name:
                    return self.json(200, fake.listing(bucket, query))
                if self.command == "GET" and query.get("alt") == "media":
                    data = fake.stored(bucket, name)
                    crc = base64.b64encode(google_crc32c.Checksum(data).digest()).decode()
                    return self.send(200, data, "application/octet-stream",
                                     {"x-goog-hash": f"crc32c={crc}", "x-goog-generation": "1"})  # fmt: skip
                if self.command == "GET":
                    fake.stored(bucket, name)
                    return self.json(200, fake.resource(bucket, name))
                if self.command == "DELETE" and name:
                    with fake.lock:
                        if fake.objects.pop((bucket, name), None) is None:
                            raise Refused(404, "notFound", f"No such object: {bucket}/{name}")
                    return self.send(204, b"", "application/json")
                raise Refused(405, "methodNotAllowed", "Method not allowed")

            def xml_api(self, path, raw_query, query, body):
                bucket, _, name = path.lstrip("/").partition("/")
                name = urllib.parse.unquote(name)
                if not bucket or not name:
                    raise Refused(404, "NoSuchKey", "The specified key does not exist.")
                if self.command == "POST" and "uploads" in query:
                    return self.send(200, fake.initiate(bucket, name), "application/xml")
                if self.command == "PUT" and "partNumber" in query:
                    fake.check_signature("PUT", path, raw_query, self.headers.get("Host", ""))
                    with fake.in_flight():
                        etag = fake.put_part(bucket, name, query, body)
                    return self.send(200, b"", "text/plain", {"ETag": etag})
                if self.command == "POST" and "uploadId" in query:
                    return self.send(200, fake.complete(bucket, name, query, body), "application/xml")
                if self.command == "DELETE" and "uploadId" in query:
                    fake.abort(bucket, name, query)
                    return self.send(204, b"", "application/xml")
                raise Refused(405, "MethodNotAllowed", "The fake serves multipart uploads only on the XML API.")

            def json(self, status, payload):
                self.send(status, json.dumps(payload).encode(), "application/json")

            def send(self, status, body, content_type, headers=None):
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

        return Handler


def xml(root, **fields):
    """An XML API answer; its results are in the S3 namespace, as GCS's are (its errors are not)."""
    space = "" if root == "Error" else f"{{{S3}}}"
    element = ElementTree.Element(space + root)
    for key, value in fields.items():
        ElementTree.SubElement(element, space + key).text = value
    return b'<?xml version="1.0" encoding="UTF-8"?>' + ElementTree.tostring(element)


def unb64(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
