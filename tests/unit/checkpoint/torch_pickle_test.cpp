// rewrite_torch_pickle (src/lockstep/checkpoint/torch_pickle.h) on pickles written out byte by
// byte: what it rewrites, what LibTorch's unpickler then reads, and what it refuses.
#include "../../../src/lockstep/checkpoint/torch_pickle.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

namespace lockstep {
namespace checkpoint {
namespace detail {
namespace torch_pickle_test {

using namespace std::string_literals;

// A BINUNICODE string opcode.
std::string str(const std::string& s) {
  const auto n = static_cast<uint32_t>(s.size());
  return "X"s + static_cast<char>(n & 0xFF) + static_cast<char>(n >> 8 & 0xFF) + static_cast<char>(n >> 16 & 0xFF) +
         static_cast<char>(n >> 24) + s;
}

const std::string kProto = "\x80\x02"s;

PickleRewrite rewrite(const std::string& pickle) { return rewrite_torch_pickle(pickle.data(), pickle.size()); }

c10::IValue unpickle(const std::vector<char>& pickle) { return torch::jit::unpickle(pickle.data(), pickle.size()); }

// {"k": 7} as an OrderedDict whose attributes are {"_metadata": OrderedDict({"": {"version": 1}})}:
// the opcodes Python writes for torch.save(model.state_dict()) (memo 7 is "version").
const std::string kOrderedDictWithMetadata =
    "ccollections\nOrderedDict\nq\x00)Rq\x01("s + str("k") + "K\x07u" + "}q\x02"s + str("_metadata") + "q\x03h\x00)Rq\x04("s +
    str("") + "q\x05}q\x06"s + str("version") + "q\x07K\x01su" + "sb"s;

TEST(TorchPickle, SetItemAppendAndANarrowLong1BecomeWhatLibTorchReads) {
  // {"a": [1, -1, 2**40]} with SETITEM, APPEND and LONG1 of 1 and 6 bytes.
  const std::string pickle =
      kProto + "}" + str("a") + "]K\x01"s + "a\x8a\x01\xff"s + "a\x8a\x06\x00\x00\x00\x00\x00\x01"s + "as.";
  const auto result = rewrite(pickle);
  ASSERT_EQ(result.problem, "");
  const std::string expected = kProto + "}(" + str("a") + "](K\x01"s + "e(\x8a\x08\xff\xff\xff\xff\xff\xff\xff\xff"s +
                               "e(\x8a\x08\x00\x00\x00\x00\x00\x01\x00\x00"s + "eu.";
  EXPECT_EQ(std::string(result.pickle.begin(), result.pickle.end()), expected);
  const c10::IValue value = unpickle(result.pickle);
  const auto list = value.toGenericDict().at("a").toListRef();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].toInt(), 1);
  EXPECT_EQ(list[1].toInt(), -1);
  EXPECT_EQ(list[2].toInt(), int64_t{1} << 40);
}

TEST(TorchPickle, AnOrderedDictIsADictAndItsAttributesAreDropped) {
  // (the OrderedDict, "version" fetched from the memo entry the dropped attributes made)
  const auto result = rewrite(kProto + "(" + kOrderedDictWithMetadata + "h\x07t."s);
  ASSERT_EQ(result.problem, "");
  const c10::IValue value = unpickle(result.pickle);
  const auto tuple = value.toTupleRef().elements();
  ASSERT_EQ(tuple.size(), 2u);
  const auto dict = tuple[0].toGenericDict();
  EXPECT_EQ(dict.size(), 1u);
  EXPECT_EQ(dict.at("k").toInt(), 7);
  EXPECT_EQ(tuple[1].toStringRef(), "version");
}

// A Lightning checkpoint's {"hyper_parameters": AttributeDict(lr=7), "dd": defaultdict(list, a=[1])},
// in the opcodes Python writes (NEWOBJ for the dict subclass, REDUCE with the factory).
TEST(TorchPickle, LightningsAttributeDictAndADefaultdictAreDicts) {
  const std::string pickle = kProto + "}q\x00("s + str("hyper_parameters") + "q\x01"s +
                             "clightning_fabric.utilities.data\nAttributeDict\nq\x02)\x81q\x03("s + str("lr") + "K\x07u"s +
                             str("dd") + "ccollections\ndefaultdict\nq\x04" "c__builtin__\nlist\nq\x05\x85q\x06Rq\x07"s +
                             str("a") + "]K\x01" "as" "u.";
  const auto result = rewrite(pickle);
  ASSERT_EQ(result.problem, "");
  const auto dict = unpickle(result.pickle).toGenericDict();
  EXPECT_EQ(dict.at("hyper_parameters").toGenericDict().at("lr").toInt(), 7);
  const auto inner = dict.at("dd").toGenericDict().at("a").toListRef();
  ASSERT_EQ(inner.size(), 1u);
  EXPECT_EQ(inner[0].toInt(), 1);
}

// Python memoizes the classes: a second defaultdict(list) fetches both from the memo.
TEST(TorchPickle, ASecondDefaultdictOfTheSameFactoryIsADictToo) {
  const std::string pickle = kProto + "}q\x00("s + str("a") + "ccollections\ndefaultdict\nq\x01" "c__builtin__\nlist\nq\x02"
                             "\x85Rq\x03"s + str("b") + "h\x01h\x02\x85Rq\x04" "u."s;
  const auto result = rewrite(pickle);
  ASSERT_EQ(result.problem, "");
  const auto dict = unpickle(result.pickle).toGenericDict();
  EXPECT_EQ(dict.at("a").toGenericDict().size(), 0u);
  EXPECT_EQ(dict.at("b").toGenericDict().size(), 0u);
  // The memoized factory used anywhere else is still refused.
  const std::string stray = kProto + "(ccollections\ndefaultdict\nq\x00" "c__builtin__\nlist\nq\x01\x85Rq\x02" "h\x01t."s;
  EXPECT_NE(rewrite(stray).problem.find("other than as a defaultdict's default factory"), std::string::npos)
      << rewrite(stray).problem;
}

TEST(TorchPickle, ABuiltinTypeOutsideADefaultdictIsRefused) {
  for (const std::string& pickle : {kProto + "]c__builtin__\nlist\na."s, kProto + "c__builtin__\nlist\n\x85."s,
                                    kProto + "ctorch\ndevice\nc__builtin__\nlist\n\x85R."s}) {
    const auto result = rewrite(pickle);
    EXPECT_NE(result.problem.find("holds a Python type (builtins) other than as a defaultdict's default factory"),
              std::string::npos) << result.problem;
  }
  EXPECT_NE(rewrite(kProto + "cbuiltins\neval\n."s).problem.find("class builtins.eval"), std::string::npos);
}

TEST(TorchPickle, AReferenceToADroppedContainerIsRefused) {
  const auto result = rewrite(kProto + "(" + kOrderedDictWithMetadata + "h\x06t."s);  // memo 6: {"version": 1}
  EXPECT_NE(result.problem.find("refers back into an OrderedDict's attributes"), std::string::npos) << result.problem;
  EXPECT_FALSE(result.damaged);
}

TEST(TorchPickle, APickledClassIsRefusedNamingIt) {
  const auto result = rewrite(kProto + "c__main__\nNet\nq\x00)\x81}b."s);
  EXPECT_NE(result.problem.find("class __main__.Net (torch.save(model) pickles the whole module)"), std::string::npos)
      << result.problem;
  EXPECT_NE(result.problem.find("torch.save(model.state_dict(), path)"), std::string::npos) << result.problem;
  EXPECT_FALSE(result.damaged);
}

TEST(TorchPickle, StreamsNoPicklerWritesAreDamagedOrRefusedWithTheReason) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {kProto + "Nq\x05."s, "memo index skips ahead"},
      {kProto + "h\x00."s, "refers to nothing stored"},
      {kProto + "}(K\x01u."s, "key without a value"},
      {kProto + "NN."s, "STOP leaves other than one value"},
      {kProto + "t."s, "needs a MARK"},
      {kProto + "X\xff\xff\x00\x00" "abc."s, "runs past the end"},
      {kProto + "ccollections\nOrderedDict"s, "not ended by a newline"},
      {kProto + "]q\x00h\x00" "a."s, "contains itself"},
      {kProto + "N0."s, "opcode 0x30"},
      {kProto + "ccollections\nOrderedDict\n\x85."s, "other than as a dict"},
      {"\x80\x04N."s, "pickle protocol 4"},
  };
  for (const auto& [pickle, expected] : cases) {
    const auto result = rewrite(pickle);
    EXPECT_NE(result.problem.find(expected), std::string::npos) << "expected '" << expected << "' in: " << result.problem;
  }
}

TEST(TorchPickle, NestingDeeperThanAHundredIsRefused) {
  auto nested = [](int depth) { return kProto + std::string(depth, ']') + std::string(depth - 1, 'a') + "."; };
  EXPECT_EQ(rewrite(nested(100)).problem, "");
  EXPECT_NE(rewrite(nested(101)).problem.find("more than 100 deep"), std::string::npos);
}

// Every cut of a valid stream is damaged; random byte changes give a problem or a stream that
// LibTorch's unpickler takes without reading past it (a crash or a sanitizer report fails).
TEST(TorchPickle, CutAndChangedStreamsNeverReachLibTorchMalformed) {
  const std::string valid = kProto + "(" + kOrderedDictWithMetadata + "h\x07t."s;
  for (size_t keep = 0; keep < valid.size(); ++keep) {
    const auto result = rewrite(valid.substr(0, keep));
    EXPECT_TRUE(result.damaged && !result.problem.empty()) << "kept " << keep << ": " << result.problem;
  }
  std::mt19937 random(40);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string changed = valid;
    for (int k = 0, n = 1 + static_cast<int>(random() % 3); k < n; ++k) {
      changed[random() % changed.size()] = static_cast<char>(random() % 256);
    }
    const auto result = rewrite(changed);
    if (!result.problem.empty()) continue;
    ++accepted;
    try {
      unpickle(result.pickle);
    } catch (const std::exception&) {
      // LibTorch's own type checks (a key that cannot be hashed, a REDUCE of the wrong shape).
    }
  }
  std::cout << accepted << " of 20000 changed streams were accepted and unpickled\n";
  EXPECT_GT(accepted, 0);
}

}  // namespace torch_pickle_test
}  // namespace detail
}  // namespace checkpoint
}  // namespace lockstep
