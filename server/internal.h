/* Declarations shared between the server's files: configuration, shards,
 * connections, requests, the plugin host, buffers and queues. */

/* The life of a request, and the function at each step (file):
 *
 *  accept     on_accept (listen.c) → shard_handoff → the shard's eventfd →
 *             shard_on_notify → conn_shard_ops.open/.start: conn_new,
 *             conn_start (conn.c)
 *  handshake  conn_on_read → conn_pump → read_some, process_input →
 *             handshake_consume (handshake.c; tls.c after STARTTLS; its
 *             replies go into c->out, outbuf.c) until the phase is
 *             CONN_TRANSMISSION; an option that calls the layer stack
 *             (.open, .list_exports) goes through shard_handshake_call to
 *             a worker (handshake_call) and back (conn_handshake_answered
 *             → handshake_call_done) when the shard has workers
 *  parse      conn_parse (conn.c) → protocol_consume (protocol.c):
 *             request_get (request.c), protocol_validate, attach_buffer;
 *             it returns what conn.c does next: RUN, ANSWER (an error
 *             reply), PAYLOAD (conn.c copies a WRITE's buffered payload in,
 *             read_some reads the rest straight into its buffer) or
 *             STALLED (conn_wait_buffers; conn_wake_waiters retries it
 *             with protocol_retry_stalled)
 *  dispatch   conn_dispatch → shard_dispatch (shard.c): protocol_start_aio
 *             when the plugin completes requests itself (aio: its thread
 *             runs shard_aio_done → protocol_aio_finish, shard_complete),
 *             else inline on the shard thread (returns true: conn.c queues
 *             the reply), or queue_push (queue.c) to a worker that runs
 *             shard_run_request
 *  backend    protocol_execute → backend (layer stack): backend_pread,
 *             backend_pwrite, ... on c->pc.top (backend.c), down through
 *             filters and the cache to the plugin (docs/ARCHITECTURE.md);
 *             timed by delayacct_plugin_begin/end (delayacct.h)
 *  reply      protocol_execute builds the reply iovecs (put_simple,
 *             put_error, put_read_reply); inline: conn_on_complete; from a
 *             worker: shard_complete → shard_on_notify →
 *             conn_shard_ops.completed (conn_completed) → conn_on_complete,
 *             which queues it on the connection and conn_mark_flush
 *  send       conn_flush_marked → conn_flush → send_pending (one sendmsg
 *             for many replies, tls_sendv under TLS, sendfile for lent file
 *             data) → request_free: delayacct_done, request_put
 *
 * Back-pressure at any step stops reading; why is c->read_block.
 *
 * Layering: each file calls only files below it (test-build-layering.py):
 * request.c, outbuf.c < protocol.c, handshake.c < shard.c < conn.c <
 * listen.c, restart.c, main.c.  The only ways up are function pointers
 * the upper file registers: struct shard_conn_ops (conn.c's, given to
 * shard_start_all) and restart.c's conn_handoff_hook and
 * shard_conn_gone_hook (set by restart_init). */
#ifndef BLKD_INTERNAL_H
#define BLKD_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

#include "log.h"
#include "minmax.h"
#include "monotime.h"
#include "nbd-proto.h"
#include "public.h"
#include "blkd-plugin.h"

struct event_base;
struct event;
struct shard_call;                  /* shard.c */
struct shard_stats;                 /* delayacct.h */
struct conn_stats;                  /* delayacct.h */

/* ---- configuration (main.c) ---------------------------------------- */

enum iobuf_mode { IOBUF_POOL, IOBUF_CALLOC };
enum queue_mode { QUEUE_SPLIT, QUEUE_GLOBAL };
enum dispatch_mode { DISPATCH_AUTO, DISPATCH_INLINE, DISPATCH_WORKER };
enum tls_mode { TLS_OFF, TLS_ON, TLS_REQUIRE };
enum delayacct_mode { DELAYACCT_COMPACT, DELAYACCT_LOCKED, DELAYACCT_OFF };
enum cache_mode { CACHE_WRITETHROUGH, CACHE_WRITEBACK };
/* --sparse-reads; NO and YES are what nbdkit_parse_bool returns. */
enum sparse_reads { SPARSE_READS_NO = 0, SPARSE_READS_YES = 1, SPARSE_READS_AUTO };
/* --ext-headers: offer NBD_OPT_EXTENDED_HEADERS, refuse it, or insist on it. */
enum ext_headers_mode { EXT_HEADERS_ON, EXT_HEADERS_OFF, EXT_HEADERS_REQUIRE };

struct blkd_config {
  const char *ip;                 /* -i; NULL: all addresses */
  const char *port;               /* -p; NULL: 10809 unless -U/socket activation */
  const char *unix_path;          /* -U */
  const char *export_name;        /* -e: the name LIST and --run's $uri use */
  const char *pidfile;            /* -P */
  const char *run_cmd;            /* --run */
  bool foreground;                /* -f */
  bool readonly;                  /* -r */
  bool socket_activated;          /* LISTEN_FDS was set for us */
  bool quiet;                     /* no start-up lines on stderr: run by another
                                     program (--run, -s, socket activation,
                                     -U -) and no -v; nbdkit says nothing then */
  bool single;                    /* -s: one client on stdin/stdout, no listener */
  bool vsock;                     /* --vsock: listen on AF_VSOCK, -p is the port */
  int ip_family;                  /* -4/-6: AF_INET, AF_INET6; 0: both */
  const char *selinux_label;      /* --selinux-label: label for our listening sockets */
  uint16_t gflags_masked;         /* handshake flags --mask-handshake turns off */
  bool no_sr;                     /* --no-sr: refuse STRUCTURED_REPLY */
  enum ext_headers_mode ext_headers;  /* --ext-headers */
  int shards;                     /* --shards; default: online CPUs */
  int workers;                    /* --threads: workers per shard (or global pool / shards) */
  uint32_t max_request;           /* --max-request: largest READ/WRITE payload */
  uint32_t max_inflight;          /* per connection before we stop reading */
  uint32_t reply_batch;           /* --reply-batch: send once this many replies wait (0: off) */
  const char *tcp_congestion;     /* --tcp-congestion: for accepted TCP sockets; NULL: the
                                     system's default */
  size_t iobuf_mem;               /* --iobuf-mem: pool bound, all shards */
  size_t iobuf_conn_cap;          /* pool bytes one connection may hold */
  enum iobuf_mode iobuf;
  enum queue_mode queue;
  enum dispatch_mode dispatch;
  enum sparse_reads sparse_reads; /* OFFSET_HOLE chunks; auto: where extents are cheap */

  /* Limits (hardening). */
  unsigned max_connections;       /* --max-connections; 0: no limit */
  unsigned handshake_timeout;     /* --handshake-timeout seconds; 0: none */
  unsigned idle_timeout;          /* --idle-timeout seconds; 0: none */
  unsigned poll_us;               /* --poll-us: poll window while requests come close
                                     together (shard_main); 0: never poll */
  unsigned restart_timeout;       /* --restart-timeout seconds: a live restart's wait
                                     for each connection's request to finish */
  bool fdstore;                   /* --fdstore: SIGTERM hands the connections to
                                     systemd's file descriptor store */

  /* TLS (tls.c). */
  enum tls_mode tls;
  const char *tls_certificates;   /* dir with ca-cert.pem, server-cert.pem, server-key.pem */
  const char *tls_psk;            /* psktool file: username:hexkey */
  bool tls_verify_peer;
  const char *tls_suites;         /* --tls-suites: TLS 1.3 order (NULL: ours) */

  /* Observability (metrics.c, delayacct.c). */
  const char *metrics_addr;       /* --metrics ADDR:PORT; NULL: off */
  enum delayacct_mode delayacct;

  /* Block cache (cache.c). */
  uint64_t cache_size;            /* --cache; 0: off */
  uint32_t cache_block;           /* --cache-block */
  enum cache_mode cache_mode;
  bool cache_ctor;                /* --cache-ctor=yes: keep entries constructed */
};
extern struct blkd_config cfg;

/* Set when the server is shutting down (signal, nbdkit_shutdown, --run end). */
extern atomic_bool server_stopping;
void server_request_stop (void);

/* ---- the layer stack (backend.c, backend.h) ------------------------- */

/* What the outermost layer says about one opened export, fetched once at
 * open time: the protocol validates every request against it. */
struct backend_caps {
  int64_t size;
  bool can_write, can_flush, is_rotational, can_trim, can_multi_conn;
  bool can_extents, can_fast_zero;
  int can_zero;                   /* NBDKIT_ZERO_NONE/EMULATE/NATIVE */
  int can_fua;                    /* NBDKIT_FUA_NONE/EMULATE/NATIVE */
  int can_cache;                  /* NBDKIT_CACHE_NONE/EMULATE/NATIVE */
  uint32_t block_min, block_pref, block_max;  /* 0 0 0: no layer gave any */
};

/* One connection's handle on the stack: the outermost layer's context,
 * its caps, the lock the thread model asks for, and the context
 * nbdkit_export_name() etc. answer from. */
struct context;
struct backend_conn {
  struct context *top;            /* NULL until opened */
  struct backend_caps caps;
  pthread_mutex_t request_lock;   /* SERIALIZE_REQUESTS: one request at a time */
  struct public_conn_ctx ctx;
};

/* Start-up and shutdown (stack.c, main thread); -1 after printing why. */
int backend_stack_load (const char *plugin, const char *const *filters, int nfilters,
                        int argc, char **argv);
int backend_stack_dump (const char *plugin, const char *const *filters, int nfilters);
int backend_stack_after_fork (void);
void backend_stack_unload (void);
int plugin_help (const char *name);   /* PLUGIN --help: nbdkit's plugin usage */
const char *plugin_name (void);
/* The running executable's directory (layerpath.c), where an uninstalled
 * ./blkd finds the in-tree plugins and filters; malloc'd, NULL if
 * /proc/self/exe cannot be read. */
char *layer_exe_dir (void);
int backend_thread_model (void);  /* the strictest of all layers */
bool backend_inline_safe (void);  /* every layer fast enough for the shard thread */

/* Per connection (shard thread). */
void backend_conn_init (struct backend_conn *bc, int fd);
void backend_conn_fini (struct backend_conn *bc);
int backend_conn_preconnect (struct backend_conn *bc, bool readonly);
struct nbdkit_exports *backend_conn_list_exports (struct backend_conn *bc, bool readonly);
const char *backend_conn_default_export (struct backend_conn *bc, bool readonly);
int backend_conn_open (struct backend_conn *bc, const char *export_name, bool readonly);
void backend_conn_close (struct backend_conn *bc);
const char *backend_conn_export_description (struct backend_conn *bc);

/* The thread model's lock, taken once around a whole request (every layer
 * runs under it, as in nbdkit).  SERIALIZE_CONNECTIONS is also enforced at
 * accept time, but the one connection's requests still run on several
 * workers, so it takes the all-requests lock too (nbdkit: "all requests
 * happen from one thread").  PARALLEL needs nothing: the common case is
 * two compares. */
/* nbdkit's NBDKIT_THREAD_MODEL_* values, named for the files that do not
 * include nbdkit's headers (backend.c checks that they agree). */
enum backend_thread_model {
  BACKEND_SERIALIZE_CONNECTIONS = 0,
  BACKEND_SERIALIZE_ALL_REQUESTS = 1,
  BACKEND_SERIALIZE_REQUESTS = 2,
  BACKEND_PARALLEL = 3,
};
extern int backend_model;
extern pthread_mutex_t backend_all_requests_lock;
static inline void
backend_lock_request (struct backend_conn *bc)
{
  if (__builtin_expect (backend_model <= BACKEND_SERIALIZE_ALL_REQUESTS, 0))
    pthread_mutex_lock (&backend_all_requests_lock);
  else if (__builtin_expect (backend_model == BACKEND_SERIALIZE_REQUESTS, 0))
    pthread_mutex_lock (&bc->request_lock);
  public_current = &bc->ctx;
  public_last_error = 0;          /* only this request's nbdkit_set_error counts */
}

static inline void
backend_unlock_request (struct backend_conn *bc)
{
  public_current = NULL;
  if (__builtin_expect (backend_model <= BACKEND_SERIALIZE_ALL_REQUESTS, 0))
    pthread_mutex_unlock (&backend_all_requests_lock);
  else if (__builtin_expect (backend_model == BACKEND_SERIALIZE_REQUESTS, 0))
    pthread_mutex_unlock (&bc->request_lock);
}

/* What the plugin lent or placed through blkd's zero-copy extension
 * (include/blkd-plugin.h), which the stack reaches as layer operations
 * (backend.h: backend_pread_lend etc.); read by /metrics. */
struct plugin_lend_stats {
  uint64_t lent_bytes;            /* lent to replies not yet sent */
  uint64_t lent_replies, sendfile_replies, placed_writes;   /* totals */
  uint64_t placed_bytes;          /* placed payloads not yet committed */
  uint64_t aio_started;           /* requests the plugin completed later (aio) */
};
void plugin_lend_stats (struct plugin_lend_stats *out);

/* ---- buffers (iobuf.c) ---------------------------------------------- */

struct iobuf {
  struct iobuf *next;             /* free list link */
  void *data;                     /* page aligned */
  uint32_t cap;                   /* bytes usable at data */
  uint8_t cls;                    /* size class index */
};
struct iobuf_pool;

/* The pool's own counters, kept where its owner puts them: in memory that
 * outlives the pool (the shard's stat block), so the metrics thread reads
 * them without touching the pool.  One writer (the pool's shard thread),
 * relaxed stores; readers use relaxed loads. */
struct iobuf_counters {
  uint64_t bytes;                 /* data buffers allocated: in use + cached */
};

/* ctr may be NULL (nobody reads the counters). */
struct iobuf_pool *iobuf_pool_new (size_t limit_bytes, struct iobuf_counters *ctr);
void iobuf_pool_free (struct iobuf_pool *p);
/* NULL (errno ENOBUFS) when the pool's bound is reached: the caller waits. */
struct iobuf *iobuf_get (struct iobuf_pool *p, size_t size);
void iobuf_put (struct iobuf_pool *p, struct iobuf *b);
/* Descriptors of one fixed size (the request code's, malloc'd by it, at
 * least a pointer big): a cached one or NULL; freed with the pool. */
void *iobuf_desc_get (struct iobuf_pool *p);
void iobuf_desc_put (struct iobuf_pool *p, void *desc);

/* ---- requests (request.c; replies built by protocol.c) ----------------- */

#define REQ_MAX_CHUNKS 16         /* sparse read: data/hole chunks at most */
/* Lent pieces one reply can carry: every iovec but the header's. */
#define REQ_LEND_MAX   (2 * REQ_MAX_CHUNKS + 1)

/* One request from header to reply.  Large (the reply headers live here)
 * and recycled by the pool without a memset: request_get() sets exactly
 * the fields every request reads before it writes them. */
struct request {
  struct request *next;           /* send queue / work queue / free list */
  struct conn *conn;
  uint64_t cookie, offset;
  uint64_t count;                 /* 64 bits only with extended headers, and then
                                     only TRIM, WRITE_ZEROES, CACHE and BLOCK_STATUS:
                                     READ/WRITE are held to the payload limit */
  uint16_t flags, type;
  int error;                      /* errno result, 0 on success */
  struct iobuf *buf;              /* READ data / WRITE payload / BS descriptors */
  const void *payload;            /* a WRITE's payload where it lies when not in
                                     buf: the connection's read buffer, for a
                                     request run on the shard thread at once */
  uint64_t t_queued;              /* ns: when parsed; once the plugin call ends,
                                     when the reply was ready (delayacct.h) */
  uint64_t d_queued, d_plugin;    /* ns: durations, measured where they happen
                                     and counted on the shard thread */
  /* Reply: iovecs into hdr[] and buf, written by the shard thread. */
  unsigned niov, iov_sent;
  struct iovec iov[2 * REQ_MAX_CHUNKS + 2];
  uint8_t hdr[REQ_MAX_CHUNKS * 48 + 64];  /* up to 44 bytes a chunk when extended */
  /* Zero-copy (blkd's extension).  A lent READ's data iovecs point into
   * the plugin's memory, and its tokens go back when the request is freed;
   * a placed WRITE's payload arrives in iov[0..nlent) (the plugin's memory)
   * and is committed or discarded; a sendfile READ sends send_len bytes of
   * send_fd after its header iovecs. */
  unsigned nlent;
  uint32_t lent_bytes;
  uint32_t held;                  /* placed or lent bytes counted in conn buf_bytes */
  bool placed;
  int send_fd;
  uint32_t send_len;
  uint64_t send_off;
  void *lent_token[REQ_LEND_MAX];
  /* Started with the plugin's aio call (blkd's extension): the plugin
   * calls aio.complete from its thread, which hands r back to the shard
   * as a worker would.  aio_t0: delay accounting's start. */
  struct blkd_aio aio;
  uint64_t aio_t0;
};

/* A request's type that is no NBD command (protocol_validate refuses
 * those): the job that carries a handshake's plugin call to a worker and
 * back (shard_handshake_call). */
#define REQUEST_HANDSHAKE 0xffffu

/* A request from the shard's pool, reset; NULL when out of memory. */
struct request *request_get (struct iobuf_pool *p);
void request_put (struct iobuf_pool *p, struct request *r);
/* A request header of either form, in host order (the cookie stays in
 * wire order: it is only echoed). */
struct protocol_header {
  uint16_t flags, type;
  uint64_t cookie, offset, length;
};
/* Parse the header at in: its size, 0 until avail holds a whole one, -1
 * when the magic is not that of the negotiated form (extended or compact). */
ssize_t protocol_parse_header (bool extended, const uint8_t *in, size_t avail,
                               struct protocol_header *h);
/* Extended headers: what NBD_CMD_FLAG_PAYLOAD_LEN says follows r's header
 * (*payload bytes of it). */
enum ext_payload {
  EXT_PAYLOAD_NONE,               /* nothing, or a WRITE's payload (the flag is
                                     cleared; a WRITE without it is one too) */
  EXT_PAYLOAD_REFUSE,             /* a payload no command takes: read past, EINVAL */
  EXT_PAYLOAD_CLOSE,              /* too big to read past: close the connection */
};
enum ext_payload protocol_ext_payload (const struct conn *c, struct request *r,
                                       uint64_t *payload);
/* Validate a parsed header; 0 or the errno to answer with. */
int protocol_validate (struct conn *c, const struct request *r);
/* Run the plugin call for r (shard thread or worker). */
void protocol_execute (struct request *r);
/* Start r with the plugin's aio call (shard thread), which calls complete
 * from the plugin's thread when done. */
enum protocol_aio {
  PROTOCOL_AIO_DECLINED,          /* not for aio: run it with protocol_execute */
  PROTOCOL_AIO_STARTED,           /* the plugin has it until complete is called */
  PROTOCOL_AIO_ANSWERED,          /* failed at once: its reply is built */
};
enum protocol_aio protocol_start_aio (struct request *r,
                                      void (*complete) (struct blkd_aio *, int));
/* In complete: build the reply of the request a belongs to; returns it. */
struct request *protocol_aio_finish (struct blkd_aio *a, int err);
uint32_t protocol_nbd_error (int err, const struct request *r);
/* Where a WRITE's payload from byte `have` on goes: at most max iovecs
 * (the pool buffer, or the pieces of a placed write); 0 when complete. */
unsigned protocol_payload_iov (struct request *r, uint32_t have, struct iovec *v,
                               unsigned max);
/* The request's lent memory or placed payload goes back to the plugin. */
void protocol_release (struct request *r);

/* ---- output buffers (outbuf.c) ---------------------------------------- */

/* Bytes queued for a socket: data[off, len) is unsent. */
struct outbuf {
  uint8_t *data;
  size_t len, off, cap;
};
/* Append; -1 (errno ENOMEM) leaves the buffer as it was. */
int outbuf_append (struct outbuf *o, const void *data, size_t len);

/* ---- connections (conn.c) ------------------------------------------- */

enum conn_phase {
  CONN_HS_CLIENT_FLAGS,           /* waiting for the client's 4 flag bytes */
  CONN_HS_OPTIONS,                /* option haggling */
  CONN_TLS_HANDSHAKE,             /* after STARTTLS: TLS handshake (tls.c) */
  CONN_TRANSMISSION,
  CONN_CLOSING,                   /* no more input; drain and free */
};

/* Why a connection is not reading (struct conn's read_block): while any
 * bit but PAUSED is set the parser takes no new request; PAUSED says the
 * read event is off, and conn_resume_reading turns it back on once the
 * other bits and the computed limits (max_inflight, handshake output,
 * a request stalled on the pool) are clear. */
enum conn_read_block {
  CONN_READ_PAUSED    = 1u << 0,  /* back-pressure: not watching the socket */
  CONN_READ_BUFFERS   = 1u << 1,  /* on the shard's list of pool waiters */
  CONN_READ_SEND_FULL = 1u << 2,  /* the socket refused bytes: parse no more */
  CONN_READ_CLOSING   = 1u << 3,  /* no more input: answer what came, then close */
  CONN_READ_STARTTLS  = 1u << 4,  /* ACK queued in clear; TLS handshake once sent */
  CONN_READ_HS_CALL   = 1u << 5,  /* a handshake option's plugin call is on a
                                     worker (handshake_call): nothing is parsed
                                     until it is answered */
};

/* A handshake option that calls into the layer stack (INFO, GO,
 * EXPORT_NAME, LIST): what handshake_consume parsed, and what
 * handshake_call found for handshake_call_done to answer with.  While a
 * worker runs handshake_call it owns this, c->pc and c->export_name. */
struct handshake_call {
  uint32_t option;                /* 0: none pending */
  bool want_name, want_desc;      /* INFO/GO asked for NBD_INFO_NAME/DESCRIPTION */
  char *name;                     /* the export name the client sent */
  int result;                     /* 0, or -1: the stack refused */
  char *desc;                     /* INFO/GO: the export's description, or NULL */
  struct nbdkit_exports *exports; /* LIST: the stack's answer */
  char *list_default;             /* LIST: what "" stands for */
};

struct conn {
  uint64_t id;
  char peer[64];
  struct log_ctx log;
  struct shard *shard;
  struct conn *next, *prev;       /* shard's list */
  int fd;                         /* -1 once the client is gone */
  int held_fd;                    /* a gone client's socket, shut down but kept
                                     open while workers or aio hold requests
                                     (peer_fd: its number must not be reused) */
  struct event *ev_read, *ev_write;
  enum conn_phase phase;
  bool no_zeroes, structured, meta_base_allocation;
  bool extended;                  /* NBD_OPT_EXTENDED_HEADERS took: 32-byte requests
                                     and replies (implies structured) */
  bool fixed_newstyle;            /* client set NBD_FLAG_C_FIXED_NEWSTYLE */
  unsigned read_block;            /* enum conn_read_block bits; 0: reading */
  bool read_drained;              /* last read was short: socket empty */
  char *export_name;

  /* Input: bytes read but not yet consumed. */
  uint8_t *rbuf;
  size_t rlen, roff, rcap;
  uint64_t t_read;                /* now_ns() when the last read into rbuf
                                     returned: where a request's queued phase
                                     starts (delayacct_parsed) */
  /* A WRITE whose payload is still arriving, or a payload being discarded. */
  struct request *recv_req;
  uint32_t recv_have;
  uint64_t discard_left;
  struct request *discard_req;    /* failed before its payload: answered once
                                     discard_left reaches 0 */
  bool write_stream;              /* last request a WRITE read straight into place */
  bool tcp;                       /* a TCP socket: its acknowledgements follow the mark */
  int rcvlowat;                   /* SO_RCVLOWAT now set (conn_set_lowat) */
  bool lowat_off;                 /* the socket refused it: leave it alone */
  struct request *stalled_req;    /* parsed, waiting for a pool buffer */
  uint32_t skip_option;           /* option too big: answered once skipped */

  /* Output: handshake bytes (written by handshake.c), then replies in
   * completion order. */
  struct outbuf out;
  struct request *sendq_head, *sendq_tail;
  size_t sendq_bytes;             /* reply bytes queued, not yet sent */
  uint32_t sendq_new;             /* replies queued since the last send (--reply-batch) */
  bool stall_expired;             /* the socket stayed full SEND_STALL_MS: parse
                                     anyway, CONN_READ_SEND_FULL stays clear */
  struct event *ev_stall;         /* the SEND_STALL_MS timer */
  struct event *ev_input;         /* one-shot: TLS waits for input to send while
                                   * reading is paused (conn_flush) */
  bool input_watch;               /* ev_input is added */

  unsigned inflight;              /* parsed, not yet freed */
  uint64_t t_created, t_active;   /* now_ns(), for the timeouts sweep */
  size_t buf_bytes;               /* pool bytes held by this connection */
  struct conn *flush_next;        /* shard's list of conns with new replies */
  bool flush_pending;
  bool sendfile_short_logged;     /* conn.c: "file ended short" said once */
  struct conn *wait_next;         /* shard's list of conns waiting for buffers */
  struct backend_conn pc;        /* this connection's handle on the layer stack */
  struct handshake_call hs;       /* an option waiting for the stack (handshake.c) */
  struct conn_stats *mstats;      /* /stats record (delayacct.c); NULL: none */

  /* TLS (tls.c): the session once STARTTLS was accepted, NULL in clear. */
  void *tls;

  /* Live restart (restart.c): take no new request; input is read only to
   * finish the one it is in (conn.c's handoff_need). */
  bool handoff;
};

/* The size of one request header on c: 32 bytes with extended headers. */
static inline size_t
protocol_header_size (const struct conn *c)
{
  return c->extended ? sizeof (struct nbd_extended_request) : sizeof (struct nbd_request);
}

/* What the shards call connections through (shard_start_all). */
extern const struct shard_conn_ops conn_shard_ops;
void conn_flush (struct conn *c);
void conn_shutdown (struct conn *c);             /* drain, then close */
void conn_close_now (struct conn *c);
/* Live restart: stop (on) or resume (off) taking new requests. */
void conn_quiesce (struct conn *c, bool on);
/* Quiesced, nothing in flight, nothing buffered either way: the socket
 * can change hands between two requests. */
bool conn_handoff_ready (const struct conn *c);
/* A quiesced connection moved on (flushed, or a request finished): set
 * by restart.c at start-up (restart_init), called only for connections
 * it quiesced. */
extern void (*conn_handoff_hook) (struct conn *c);

/* ---- TLS (tls.c) ------------------------------------------------------ */

int tls_setup (void);             /* start-up: -1 after printing why */
void tls_cleanup (void);
int tls_reload (void);            /* SIGHUP: re-read the credential files; -1 keeps the old */
int tls_start (struct conn *c);   /* STARTTLS accepted: make the session */
void tls_free (struct conn *c);
/* The transport under conn.c once c->tls is set: -1 with errno EAGAIN
 * when the socket would block, 0 at EOF; sendv returns plaintext bytes
 * consumed. */
ssize_t tls_recv (struct conn *c, void *buf, size_t len);
ssize_t tls_sendv (struct conn *c, const struct iovec *iov, int n);
/* Clear-text output drained: finish STARTTLS's switch, drive a handshake
 * waiting to write.  0, 1 (wait for writability) or -1 (close). */
int tls_flushed (struct conn *c);
bool tls_pending (struct conn *c);  /* decrypted or buffered input left */
bool tls_unsent (struct conn *c);   /* sealed records the socket has not taken */
bool tls_send_waits_input (struct conn *c);  /* sending waits for the client's bytes */

/* ---- handshake (handshake.c) ----------------------------------------- */

void handshake_start (struct conn *c);
/* What the handshake told the client about its open export; a live
 * restart checks that a reopened export still says the same. */
uint16_t handshake_export_flags (struct conn *c);
void handshake_block_sizes (struct conn *c, uint32_t *min, uint32_t *pref, uint32_t *max);
/* Consume handshake bytes from c->rbuf; 0 to continue, -1 to close, or
 * HANDSHAKE_CALL: an option needs the layer stack (its .open,
 * .list_exports, ...), which may block for as long as the plugin's
 * storage takes.  The caller runs handshake_call, on a worker when the
 * shard has them (nothing else may touch the connection's stack handle
 * meanwhile), then handshake_call_done on the shard thread, which queues
 * the replies (0, or -1 to close) and the handshake goes on with the
 * bytes after the option.  A connection closed meanwhile gives the
 * results back with handshake_call_discard. */
#define HANDSHAKE_CALL 1
int handshake_consume (struct conn *c);
void handshake_call (struct conn *c);
int handshake_call_done (struct conn *c);
void handshake_call_discard (struct conn *c);

/* ---- transmission input (protocol.c) --------------------------------- */
/* What the parser hands its caller (conn.c), which does the rest: the
 * parser reads no payload and runs nothing. */
enum protocol_next {
  PROTOCOL_WAIT,                  /* nothing more until input comes or a block clears */
  PROTOCOL_CLOSE,                 /* protocol error: answer what came, then close */
  PROTOCOL_RUN,                   /* *out is complete: dispatch it */
  PROTOCOL_ANSWER,                /* *out failed, its error reply built: queue it */
  PROTOCOL_PAYLOAD,               /* c->recv_req's payload is next in the stream:
                                     read it in (protocol_payload_iov), then dispatch */
  PROTOCOL_STALLED,               /* c->stalled_req waits for a pool buffer: park c
                                     until buffers return, then protocol_retry_stalled */
};
/* Parse from c->rbuf up to the next thing the caller must do. */
enum protocol_next protocol_consume (struct conn *c, struct request **out);
/* Retry a request that waited for a buffer: PROTOCOL_STALLED while the
 * pool is still at its bound, else as protocol_consume (PROTOCOL_WAIT:
 * nothing to do but read on). */
enum protocol_next protocol_retry_stalled (struct conn *c, struct request **out);

/* ---- shards (shard.c) ------------------------------------------------ */

struct shard {
  int index;
  pthread_t thread;
  struct event_base *base;
  int notify_fd;                  /* eventfd: handoffs and completions */
  struct event *ev_notify;
  pthread_mutex_t lock;           /* guards the two lists below */
  struct shard_new { int fd; char peer[64]; } *new_conns;   /* handed over */
  size_t n_new, cap_new;
  struct request *done_head, *done_tail;  /* completed by workers */
  struct conn *conns;             /* shard thread only */
  unsigned nconns;
  atomic_uint nconns_shared;      /* for the acceptor's balancing */
  struct iobuf_pool *pool;
  struct conn *waiters;           /* conns waiting for pool buffers (conn.c) */
  struct conn *flush_list;        /* conns with replies queued this round (conn.c) */
  struct event *ev_drain_timeout;
  struct event *ev_sweep;         /* handshake/idle timeouts: armed only
                                     while a connection may need them */
  struct queue *queue;            /* this shard's work queue (split mode) */
  bool draining;
  uint64_t reads;                 /* read callbacks run: the poll window's signal */
  const struct conn *last_reader; /* whose read callback ran last (compared only) */
  int last_reader_fd;             /* its socket (-1: none), and its id: where */
  uint64_t last_reader_id;        /*   its client runs (shard.c's polling) */
  uint64_t reader_changes;        /* times it was another connection than before */
  unsigned lowat_conns;           /* conns waiting on a payload under SO_RCVLOWAT */
  struct shard_stats *stats;      /* counters and delay accounting (delayacct.c) */
  struct shard_call *calls;       /* run on this thread (shard_call); under lock */
  atomic_uint aio_inflight;       /* with the plugin's aio, not yet completed */
};

extern struct shard *shards;
extern int nshards;

/* The one path from the shards up to the connections: conn.c's
 * conn_shard_ops, given to shard_start_all.  Everything else goes down
 * (conn.c calls shard_dispatch and shard_conn_gone). */
struct shard_conn_ops {
  /* A socket handed over (or adopted): the connection, NULL + errno. */
  struct conn *(*open) (struct shard *s, int fd, const char *peer);
  void (*start) (struct conn *c);               /* greet the client */
  /* After each wake-up: requests workers or the plugin's aio finished
   * (linked by next, replies built; may be NULL): queue and send them,
   * and let connections waiting for pool buffers retry. */
  void (*completed) (struct shard *s, struct request *done);
  /* Once a second while needed: the timeouts; false once no connection
   * of s has one that could expire (the shard then stops the timer
   * until a connection arrives). */
  bool (*sweep) (struct shard *s);
  void (*shutdown) (struct conn *c);            /* drain, then close */
  void (*close_now) (struct conn *c);
};

int shard_start_all (const struct shard_conn_ops *ops);
void shard_stop_all (void);      /* drain connections, join threads */
void shard_handoff (int fd, const char *peer);
void shard_complete (struct request *r);          /* worker → shard */
/* Run r: with the plugin's aio, inline, or on a worker.  True when its
 * reply is built already (inline, or failed at once): the caller queues
 * it; false: it comes back through the ops' completed. */
bool shard_dispatch (struct request *r);
/* Will shard_dispatch run r on this thread before it returns (no worker,
 * no aio)?  Then what r points to need only live until it returns. */
bool shard_runs_inline (const struct request *r);
/* Run handshake_call for c: inline when requests run inline (1: done
 * now), else on a worker (0: it comes back through the ops' completed as
 * a request of type REQUEST_HANDSHAKE, counted in c->inflight); -1 when
 * out of memory. */
int shard_handshake_call (struct conn *c);
void shard_conn_gone (struct shard *s, struct conn *c);
unsigned shard_total_conns (void);
/* Run fn on s's thread, after what it has queued (main thread); -1 when
 * out of memory. */
int shard_call (struct shard *s, void (*fn) (struct shard *, void *), void *arg);
/* A connection that did not come through the acceptor (a live restart's),
 * counted as shard_handoff counts; on s's thread.  NULL + errno. */
struct conn *shard_conn_adopt (struct shard *s, int fd, const char *peer);
/* A connection of s was freed: set by restart.c at start-up (a quiescing
 * shard may now be ready); NULL: nobody asks. */
extern void (*shard_conn_gone_hook) (struct shard *s);

/* ---- work queues (queue.c) ------------------------------------------- */

struct queue;
/* What a worker does with each request it takes off the queue. */
typedef void queue_run_fn (struct request *r);
struct queue *queue_new (int nworkers, const char *name, queue_run_fn *run);
void queue_push (struct queue *q, struct request *r);
void queue_stop (struct queue *q);               /* join workers, free */

/* ---- listeners (listen.c) -------------------------------------------- */

/* Sockets another image left us (restart_listeners): added with add,
 * their count returned (0: none, -1: failed). */
typedef int listen_inherited_fn (int (*add) (int fd), bool *unix_created);
/* inherited: where sockets from an earlier image come from (main.c
 * passes restart_listeners; listen.c never calls up into restart.c).
 * -1 + message. */
int listen_setup (listen_inherited_fn *inherited);
int listen_start (struct event_base *main_base);
void listen_stop (void);
void listen_cleanup (void);                       /* unlink Unix socket */
/* For --run: the URI and parts clients use to reach us. */
const char *listen_uri (void);
const char *listen_port (void);
const char *listen_unix_path (void);
/* Live restart: stop (true) or resume accepting; the listening fds. */
void listen_hold (bool hold);
const int *listen_fds_get (int *n);

/* ---- live restart (restart.c) ------------------------------------------ */

#define RESTART_ENV "BLKD_RESTART_FD"
/* First thing in main: the command line and binary a restart execs. */
void restart_save_argv (int argc, char **argv);
/* Start-up, after the options: read the state a live restart passed in
 * RESTART_ENV, or one systemd passed back from its file descriptor store
 * (LISTEN_FDNAMES), if any.  Never fails: a state that does not parse is
 * logged and its connections closed. */
void restart_init (void);
bool restart_adopting (void);     /* this image was started by a live restart */
/* listen.c: add the inherited listening sockets; their count (0: none). */
int restart_listeners (int (*add) (int fd), bool *unix_created);
/* After the shards and listeners start: serve the inherited connections. */
void restart_adopt_conns (void);
/* SIGUSR2 (store false), or SIGTERM with --fdstore under systemd (store
 * true), on the main loop; -1: refused, nothing paused. */
int restart_begin (struct event_base *main_base, bool store);
/* main's exit path: the sockets stay open and restart_exec follows. */
bool restart_exec_pending (void);
bool restart_to_store (void);     /* ...and go to systemd, not to an exec */
/* After the plugin is unloaded: exec the binary, or hand everything to
 * systemd's store.  Returns 0 once stored (exit 0), -1 if nothing could
 * take the connections (an exec that succeeds does not return). */
int restart_exec (void);
/* Serving: remove what was taken from the store, then READY=1. */
void restart_ready (void);
/* Exit path, once the shards are stopped, before the main loop is freed. */
void restart_cleanup (void);
uint64_t restart_count (void);
uint64_t restart_handed_total (void);

/* ---- the service manager's $NOTIFY_SOCKET (sdnotify.c) ---------------- */

bool sdnotify_available (void);
/* One datagram, with up to 4 fds passed (SCM_RIGHTS); 0 or -1 (errno). */
int sdnotify_send (const char *msg, const int *fds, int nfds);
/* 0 once the manager has handled every message sent before. */
int sdnotify_barrier (int timeout_ms);
void sdnotify_close (void);

/* ---- -D NAME.FLAG=N (debugflags.c) ------------------------------------ */

int debug_flag_add (const char *arg);             /* -1 + message */
/* Set NAME_debug_FLAG in a just-opened plugin (or filter) named NAME. */
int debug_flags_apply (void *dl, const char *name, const char *path);
void debug_flags_warn_unused (void);
void debug_flags_free (void);

#endif
