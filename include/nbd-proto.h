/* NBD wire format: magics, option/command/flag numbers and packed structs (proto.md). */
#ifndef BLKD_NBD_PROTO_H
#define BLKD_NBD_PROTO_H

#include <stdint.h>

#define NBD_MAGIC               UINT64_C(0x4e42444d41474943) /* "NBDMAGIC" */
#define NBD_OPTS_MAGIC          UINT64_C(0x49484156454f5054) /* "IHAVEOPT" */
#define NBD_REP_MAGIC           UINT64_C(0x3e889045565a9)
#define NBD_REQUEST_MAGIC       0x25609513u
#define NBD_SIMPLE_REPLY_MAGIC  0x67446698u
#define NBD_STRUCTURED_REPLY_MAGIC 0x668e33efu
/* Extended headers (NBD_OPT_EXTENDED_HEADERS): 32-byte requests and replies. */
#define NBD_EXTENDED_REQUEST_MAGIC 0x21e41c71u
#define NBD_EXTENDED_REPLY_MAGIC   0x6e8a278cu

/* Handshake flags (server) and client flags. */
#define NBD_FLAG_FIXED_NEWSTYLE  (1u << 0)
#define NBD_FLAG_NO_ZEROES       (1u << 1)
#define NBD_FLAG_C_FIXED_NEWSTYLE NBD_FLAG_FIXED_NEWSTYLE
#define NBD_FLAG_C_NO_ZEROES      NBD_FLAG_NO_ZEROES

/* Options. */
#define NBD_OPT_EXPORT_NAME       1
#define NBD_OPT_ABORT             2
#define NBD_OPT_LIST              3
#define NBD_OPT_STARTTLS          5
#define NBD_OPT_INFO              6
#define NBD_OPT_GO                7
#define NBD_OPT_STRUCTURED_REPLY  8
#define NBD_OPT_LIST_META_CONTEXT 9
#define NBD_OPT_SET_META_CONTEXT  10
#define NBD_OPT_EXTENDED_HEADERS  11

/* Option replies. */
#define NBD_REP_ACK           1
#define NBD_REP_SERVER        2
#define NBD_REP_INFO          3
#define NBD_REP_META_CONTEXT  4
#define NBD_REP_ERR(n)        (0x80000000u | (n))
#define NBD_REP_ERR_UNSUP     NBD_REP_ERR(1)
#define NBD_REP_ERR_POLICY    NBD_REP_ERR(2)
#define NBD_REP_ERR_INVALID   NBD_REP_ERR(3)
#define NBD_REP_ERR_PLATFORM  NBD_REP_ERR(4)
#define NBD_REP_ERR_TLS_REQD  NBD_REP_ERR(5)
#define NBD_REP_ERR_UNKNOWN   NBD_REP_ERR(6)
#define NBD_REP_ERR_SHUTDOWN  NBD_REP_ERR(7)
#define NBD_REP_ERR_BLOCK_SIZE_REQD NBD_REP_ERR(8)
#define NBD_REP_ERR_TOO_BIG   NBD_REP_ERR(9)
#define NBD_REP_ERR_EXT_HEADER_REQD NBD_REP_ERR(10)

/* NBD_REP_INFO types. */
#define NBD_INFO_EXPORT       0
#define NBD_INFO_NAME         1
#define NBD_INFO_DESCRIPTION  2
#define NBD_INFO_BLOCK_SIZE   3

/* Transmission flags. */
#define NBD_FLAG_HAS_FLAGS         (1u << 0)
#define NBD_FLAG_READ_ONLY         (1u << 1)
#define NBD_FLAG_SEND_FLUSH        (1u << 2)
#define NBD_FLAG_SEND_FUA          (1u << 3)
#define NBD_FLAG_ROTATIONAL        (1u << 4)
#define NBD_FLAG_SEND_TRIM         (1u << 5)
#define NBD_FLAG_SEND_WRITE_ZEROES (1u << 6)
#define NBD_FLAG_SEND_DF           (1u << 7)
#define NBD_FLAG_CAN_MULTI_CONN    (1u << 8)
#define NBD_FLAG_SEND_CACHE        (1u << 10)
#define NBD_FLAG_SEND_FAST_ZERO    (1u << 11)
#define NBD_FLAG_BLOCK_STATUS_PAYLOAD (1u << 12)  /* not offered by blkd */

/* Commands. */
#define NBD_CMD_READ          0
#define NBD_CMD_WRITE         1
#define NBD_CMD_DISC          2
#define NBD_CMD_FLUSH         3
#define NBD_CMD_TRIM          4
#define NBD_CMD_CACHE         5
#define NBD_CMD_WRITE_ZEROES  6
#define NBD_CMD_BLOCK_STATUS  7
#define NBD_CMD_COUNT         8   /* number of command types we account for */

/* The one command-name table: log lines and metric labels use it. */
static inline const char *
nbd_cmd_name (uint32_t type)
{
  static const char *const names[NBD_CMD_COUNT] = {
    [NBD_CMD_READ] = "read", [NBD_CMD_WRITE] = "write", [NBD_CMD_DISC] = "disc",
    [NBD_CMD_FLUSH] = "flush", [NBD_CMD_TRIM] = "trim", [NBD_CMD_CACHE] = "cache",
    [NBD_CMD_WRITE_ZEROES] = "write_zeroes", [NBD_CMD_BLOCK_STATUS] = "block_status",
  };
  return type < NBD_CMD_COUNT ? names[type] : "unknown";
}

/* Command flags. */
#define NBD_CMD_FLAG_FUA       (1u << 0)
#define NBD_CMD_FLAG_NO_HOLE   (1u << 1)
#define NBD_CMD_FLAG_DF        (1u << 2)
#define NBD_CMD_FLAG_REQ_ONE   (1u << 3)
#define NBD_CMD_FLAG_FAST_ZERO (1u << 4)
#define NBD_CMD_FLAG_PAYLOAD_LEN (1u << 5) /* extended headers: length is a payload */

/* Structured reply chunk types and flags. */
#define NBD_REPLY_FLAG_DONE           (1u << 0)
#define NBD_REPLY_TYPE_NONE           0
#define NBD_REPLY_TYPE_OFFSET_DATA    1
#define NBD_REPLY_TYPE_OFFSET_HOLE    2
#define NBD_REPLY_TYPE_BLOCK_STATUS   5
#define NBD_REPLY_TYPE_BLOCK_STATUS_EXT 6  /* extended headers: 64-bit extents */
#define NBD_REPLY_TYPE_ERROR_BIT      (1u << 15)  /* set in every error chunk type */
#define NBD_REPLY_TYPE_ERROR          (NBD_REPLY_TYPE_ERROR_BIT + 1)
#define NBD_REPLY_TYPE_ERROR_OFFSET   (NBD_REPLY_TYPE_ERROR_BIT + 2)

/* base:allocation states (the same bits as nbdkit's extent types). */
#define NBD_STATE_HOLE  (1u << 0)
#define NBD_STATE_ZERO  (1u << 1)

/* Wire errno values. */
#define NBD_EPERM      1
#define NBD_EIO        5
#define NBD_ENOMEM     12
#define NBD_EINVAL     22
#define NBD_ENOSPC     28
#define NBD_EOVERFLOW  75
#define NBD_ENOTSUP    95
#define NBD_ESHUTDOWN  108

#define NBD_MAX_STRING 4096   /* longest export name/description we accept */

struct nbd_request {
  uint32_t magic;
  uint16_t flags;
  uint16_t type;
  uint64_t cookie;
  uint64_t offset;
  uint32_t count;
} __attribute__((packed));

/* With extended headers the length is 64 bits: an effect length, or a
 * payload length when NBD_CMD_FLAG_PAYLOAD_LEN is set. */
struct nbd_extended_request {
  uint32_t magic;
  uint16_t flags;
  uint16_t type;
  uint64_t cookie;
  uint64_t offset;
  uint64_t length;
} __attribute__((packed));

struct nbd_simple_reply {
  uint32_t magic;
  uint32_t error;
  uint64_t cookie;
} __attribute__((packed));

struct nbd_structured_reply {
  uint32_t magic;
  uint16_t flags;
  uint16_t type;
  uint64_t cookie;
  uint32_t length;
} __attribute__((packed));

/* Every reply chunk once extended headers are on; offset echoes the
 * request's. */
struct nbd_extended_reply {
  uint32_t magic;
  uint16_t flags;
  uint16_t type;
  uint64_t cookie;
  uint64_t offset;
  uint64_t length;
} __attribute__((packed));

struct nbd_option_header {
  uint64_t magic;
  uint32_t option;
  uint32_t length;
} __attribute__((packed));

struct nbd_option_reply {
  uint64_t magic;
  uint32_t option;
  uint32_t reply;
  uint32_t length;
} __attribute__((packed));

#endif
