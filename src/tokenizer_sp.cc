// tokenizer_sp.cc — libsentencepiece behind tokenizer.h's C functions
// (built when configure finds the library; tokenizer.c otherwise says so).
#include <sentencepiece_processor.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "tokenizer.h"
}

extern "C" void *tokenizer_sp_load(const char *path, char *reason, size_t reason_size)
{
    auto *sp = new (std::nothrow) sentencepiece::SentencePieceProcessor();
    if (!sp) {
        snprintf(reason, reason_size, "out of memory");
        return nullptr;
    }
    const auto status = sp->Load(path);
    if (!status.ok()) {
        snprintf(reason, reason_size, "%s", status.ToString().c_str());
        delete sp;
        return nullptr;
    }
    return sp;
}

extern "C" void tokenizer_sp_free(void *sp) { delete static_cast<sentencepiece::SentencePieceProcessor *>(sp); }

extern "C" int tokenizer_sp_vocab(const void *sp)
{
    return static_cast<const sentencepiece::SentencePieceProcessor *>(sp)->GetPieceSize();
}

extern "C" int tokenizer_sp_encode(const void *sp, const char *text, int **ids, size_t *n)
{
    std::vector<int> v;
    const auto status = static_cast<const sentencepiece::SentencePieceProcessor *>(sp)->Encode(text, &v);
    if (!status.ok()) return -1;
    *ids = static_cast<int *>(malloc((v.size() + 1) * sizeof(int)));
    if (!*ids) return -1;
    if (!v.empty()) memcpy(*ids, v.data(), v.size() * sizeof(int));
    *n = v.size();
    return 0;
}

extern "C" int tokenizer_sp_decode(const void *sp, const int *ids, size_t n, char **text, size_t *len)
{
    std::string s;
    const std::vector<int> v(ids, ids + n);
    const auto status = static_cast<const sentencepiece::SentencePieceProcessor *>(sp)->Decode(v, &s);
    if (!status.ok()) return -1;
    *text = static_cast<char *>(malloc(s.size() + 1));
    if (!*text) return -1;
    memcpy(*text, s.data(), s.size());
    (*text)[s.size()] = '\0';
    *len = s.size();
    return 0;
}
