#pragma once
// The pickle opcodes that torch.save's data.pkl and DCP's .metadata use (protocols 2 to 5, Python's
// Lib/pickle.py names), for the readers and the writer in this folder.

namespace lockstep {
namespace checkpoint {
namespace detail {
namespace pickle {

enum Op : unsigned char {
  MARK = '(', STOP = '.', BININT = 'J', BININT1 = 'K', BININT2 = 'M', NONE = 'N', BINPERSID = 'Q',
  REDUCE = 'R', BINUNICODE = 'X', APPEND = 'a', BUILD = 'b', GLOBAL = 'c', EMPTY_DICT = '}', APPENDS = 'e',
  BINGET = 'h', LONG_BINGET = 'j', EMPTY_LIST = ']', BINPUT = 'q', LONG_BINPUT = 'r', SETITEM = 's',
  TUPLE = 't', EMPTY_TUPLE = ')', SETITEMS = 'u', BINFLOAT = 'G', PROTO = 0x80, NEWOBJ = 0x81, TUPLE1 = 0x85,
  TUPLE2 = 0x86, TUPLE3 = 0x87, NEWTRUE = 0x88, NEWFALSE = 0x89, LONG1 = 0x8a, SHORT_BINUNICODE = 0x8c,
  BINUNICODE8 = 0x8d, STACK_GLOBAL = 0x93, MEMOIZE = 0x94, FRAME = 0x95,
};

}  // namespace pickle
}  // namespace detail
}  // namespace checkpoint
}  // namespace lockstep
