/*
 * TLS on the HTTP server (http_server_set_tls, http/tls.c): the certificate and key files'
 * errors at start; then a server with TLS on TCP and a plain Unix socket, driven by a blocking
 * OpenSSL client while the loop runs in a thread: a request over TLS (the peer says tls), one
 * over the socket (plain), plain HTTP on the TLS port (closed, no answer), and a client that
 * never starts its handshake (closed at the header deadline, and counted there).
 */
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <jansson.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "http/http.h"
#include "http/tls.h"
#include "tap.h"

static char tmpdir[] = "/tmp/wr-test-tls-XXXXXX";
static char cert_path[128], key_path[128], other_key_path[128], junk_path[128], sock_path[128];
static struct event_base *base;
static struct http_server *server;

/* ---- throwaway certificates ---- */

static EVP_PKEY *new_key(void)
{
    return EVP_EC_gen("P-256");
}

/* A self-signed certificate for IP 127.0.0.1 (its own CA). */
static X509 *new_cert(EVP_PKEY *key)
{
    X509 *x = X509_new();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -60);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, key);
    X509_NAME *n = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)"127.0.0.1", -1, -1,
                               0);
    X509_set_issuer_name(x, n);
    X509V3_CTX v3;
    X509V3_set_ctx_nodb(&v3);
    X509V3_set_ctx(&v3, x, x, NULL, NULL, 0);
    X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, &v3, NID_subject_alt_name, "IP:127.0.0.1");
    X509_add_ext(x, e, -1);
    X509_EXTENSION_free(e);
    X509_sign(x, key, EVP_sha256());
    return x;
}

static void write_key(const char *path, EVP_PKEY *k)
{
    FILE *f = fopen(path, "w");
    PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL);
    fclose(f);
}

/* ---- the server (loop thread) ---- */

static void handler(struct http_req *r, void *ctx)
{
    if (strcmp(http_req_path(r), "/conn-stats") == 0) {
        struct http_conn_stats st;
        http_server_conn_stats(server, &st);
        http_reply_json(r, 200,
                        json_pack("{sI}", "header_timeouts", (json_int_t)st.header_timeouts));
        return;
    }
    struct http_peer p;
    int rc = http_req_peer(r, &p);
    http_reply_json(r, 200, json_pack("{sbsbsi}", "tls", p.tls, "unix", p.unix_socket, "rc", rc));
}

static void keepalive(evutil_socket_t fd, short what, void *arg)
{
}

static void *loop_main(void *arg)
{
    event_base_dispatch(base);
    return NULL;
}

/* ---- the client side (main thread) ---- */

static int connect_tcp(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof(sa);
    bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    getsockname(fd, (struct sockaddr *)&sa, &l);
    close(fd);
    return ntohs(sa.sin_port);
}

/* GET path over TLS, trusting cert; the answer's JSON body, or NULL. */
static json_t *tls_get(int port, X509 *cert, const char *path)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), cert);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    SSL *ssl = SSL_new(ctx);
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), "127.0.0.1");
    int fd = connect_tcp(port);
    json_t *o = NULL;
    char req[256], buf[4096];
    snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path);
    size_t n = 0;
    if (fd >= 0 && SSL_set_fd(ssl, fd) == 1 && SSL_connect(ssl) == 1 &&
        SSL_write(ssl, req, (int)strlen(req)) > 0) {
        int r;
        while (n < sizeof(buf) - 1 && (r = SSL_read(ssl, buf + n, (int)(sizeof(buf) - 1 - n))) > 0)
            n += (size_t)r;
        buf[n] = '\0';
        const char *body = strstr(buf, "\r\n\r\n");
        if (strncmp(buf, "HTTP/1.1 200", 12) == 0 && body)
            o = json_loads(body + 4, 0, NULL);
    }
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    if (fd >= 0)
        close(fd);
    ERR_clear_error();
    return o;
}

/* Reads fd to its end; returns the bytes read (into buf), or -1 if it did not end in time. */
static long read_to_end(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        ssize_t r = recv(fd, buf + n, cap - 1 - n, 0);
        if (r == 0 || (r < 0 && errno == ECONNRESET))
            break;
        if (r < 0)
            return -1;
        n += (size_t)r;
        if (n == cap - 1)
            n = 0;
    }
    buf[n] = '\0';
    return (long)n;
}

static void server_checks(X509 *cert)
{
    struct wr_err err = {0};
    int port = free_port();
    server = http_server_new(base, handler, NULL, 8000, &err);
    http_server_set_limits(server, 8, 1, 0); /* a 1 s header deadline */
    ok(http_server_set_tls(server, cert_path, key_path, &err) == 0, "TLS set (%s)", err.msg);
    ok(http_server_listen_tcp(server, "127.0.0.1", port, &err) == 0 &&
           http_server_listen_unix(server, sock_path, &err) == 0,
       "listening on TLS TCP and a plain Unix socket");
    struct event *ka = event_new(base, -1, EV_PERSIST, keepalive, NULL);
    struct timeval sec = {1, 0};
    event_add(ka, &sec);
    pthread_t loop;
    pthread_create(&loop, NULL, loop_main, NULL);

    json_t *o = tls_get(port, cert, "/peer");
    ok(o && json_is_true(json_object_get(o, "tls")) && json_is_false(json_object_get(o, "unix")),
       "a request over TLS is answered, and its peer says tls");
    json_decref(o);

    int u = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
    char buf[4096];
    const char *get = "GET /peer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    int sent = connect(u, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
               send(u, get, strlen(get), MSG_NOSIGNAL) == (ssize_t)strlen(get);
    const char *body = sent && read_to_end(u, buf, sizeof(buf)) > 0 && strstr(buf, "200 OK")
                           ? strstr(buf, "\r\n\r\n")
                           : NULL;
    json_t *uo = body ? json_loads(body + 4, 0, NULL) : NULL;
    ok(uo && json_is_false(json_object_get(uo, "tls")) && json_is_true(json_object_get(uo, "unix")),
       "the Unix socket stays plain");
    json_decref(uo);
    close(u);

    int fd = connect_tcp(port);
    send(fd, get, strlen(get), MSG_NOSIGNAL);
    long n = read_to_end(fd, buf, sizeof(buf));
    ok(n >= 0 && strncmp(buf, "HTTP/", 5) != 0, "plain HTTP on the TLS port: closed, unanswered");
    close(fd);

    fd = connect_tcp(port);
    n = read_to_end(fd, buf, sizeof(buf));
    ok(n == 0, "a client that never starts its handshake is closed (by the 1 s deadline)");
    close(fd);
    o = tls_get(port, cert, "/conn-stats");
    ok(o && json_integer_value(json_object_get(o, "header_timeouts")) >= 1,
       "counted as a header timeout");
    json_decref(o);

    o = tls_get(port, cert, "/peer");
    ok(o != NULL, "the server still answers over TLS");
    json_decref(o);

    event_base_loopbreak(base);
    pthread_join(loop, NULL);
    event_free(ka);
    http_server_free(server);
}

int main(void)
{
    if (!mkdtemp(tmpdir)) {
        ok(0, "mkdtemp");
        return tap_done();
    }
    snprintf(cert_path, sizeof(cert_path), "%s/cert.pem", tmpdir);
    snprintf(key_path, sizeof(key_path), "%s/key.pem", tmpdir);
    snprintf(other_key_path, sizeof(other_key_path), "%s/other.pem", tmpdir);
    snprintf(junk_path, sizeof(junk_path), "%s/junk.pem", tmpdir);
    snprintf(sock_path, sizeof(sock_path), "%s/s.sock", tmpdir);
    EVP_PKEY *key = new_key(), *other = new_key();
    X509 *cert = new_cert(key);
    write_key(key_path, key);
    write_key(other_key_path, other);
    FILE *f = fopen(cert_path, "w");
    PEM_write_X509(f, cert);
    fclose(f);
    f = fopen(junk_path, "w");
    fputs("not PEM\n", f);
    fclose(f);

    struct wr_err err = {0};
    SSL_CTX *ctx = tls_server_ctx(cert_path, key_path, &err);
    ok(ctx != NULL, "a certificate and its key make a context");
    SSL_CTX_free(ctx);
    ok(!tls_server_ctx(cert_path, other_key_path, &err) && strstr(err.msg, "does not match") &&
           strstr(err.msg, other_key_path),
       "a key that is not the certificate's: %s", err.msg);
    ok(!tls_server_ctx("/nonexistent/cert.pem", key_path, &err) && err.code == ENOENT &&
           strstr(err.msg, "/nonexistent/cert.pem"),
       "a missing certificate: %s", err.msg);
    ok(!tls_server_ctx(cert_path, "/nonexistent/key.pem", &err) && err.code == ENOENT,
       "a missing key: %s", err.msg);
    ok(!tls_server_ctx(junk_path, key_path, &err) && strstr(err.msg, "not a PEM certificate"),
       "a certificate file that is not PEM: %s", err.msg);
    ok(!tls_server_ctx(cert_path, junk_path, &err) && strstr(err.msg, "not a PEM private key"),
       "a key file that is not PEM: %s", err.msg);
    ok(!tls_server_ctx(cert_path, cert_path, &err) && strstr(err.msg, "not a PEM private key"),
       "a certificate given as the key: %s", err.msg);

    evthread_use_pthreads();
    base = event_base_new();
    server_checks(cert);
    event_base_free(base);

    X509_free(cert);
    EVP_PKEY_free(key);
    EVP_PKEY_free(other);
    unlink(cert_path);
    unlink(key_path);
    unlink(other_key_path);
    unlink(junk_path);
    unlink(sock_path);
    rmdir(tmpdir);
    return tap_done();
}
